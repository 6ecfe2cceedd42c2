/* MathJax from its CDN, for a book built without `make book` (plain
   `jupyter-book build .`): the math then needs a network. `make book`
   vendors MathJax into _vendor/mathjax, whose tex-mml-chtml.js replaces
   this file in the built pages (_config.yml: html_static_path). */
(function () {
  var s = document.createElement('script');
  s.src = 'https://cdn.jsdelivr.net/npm/mathjax@3.2.2/es5/tex-mml-chtml.js';
  s.async = true;
  document.head.appendChild(s);
})();
