// Render the math that pymdownx.arithmatex (generic mode) left in the page: display math as
// \[...\] in div.arithmatex, inline math as \(...\) in span.arithmatex. Only those elements are
// touched, so a "$" in prose or code is never taken for math. Uses the vendored KaTeX
// (assets/vendor/katex); nothing is fetched from the network.
(function () {
  function render(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, {
        delimiters: [
          { left: "$$", right: "$$", display: true },
          { left: "\\[", right: "\\]", display: true },
          { left: "\\(", right: "\\)", display: false },
        ],
        throwOnError: false,
      });
    });
  }
  // Material exposes document$ (emits on load and on instant navigation); fall back to
  // DOMContentLoaded for any other theme.
  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { render(document.body); });
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { render(document.body); });
  } else {
    render(document.body);
  }
})();
