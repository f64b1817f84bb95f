// Starts the vendored Swagger UI on /docs. A file, not an inline script, so the page's
// Content-Security-Policy can keep script-src 'self'. validatorUrl: null keeps the browser from
// sending our schema to validator.swagger.io.
window.addEventListener("DOMContentLoaded", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
