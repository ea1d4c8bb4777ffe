// The "what if" panel (issue 22) fills <section id="whatif">: written
// elsewhere. This placeholder keeps the page whole until it lands. The
// page's helpers are on window.floodgate (app.js): api(path, options)
// calls the admin API through /dashboard/api/ with the session.
