// The dashboard shell: hash routes, the polling loop that keeps the current page live, and the
// sign-in form shown when the API answers 401.

import { adoptTokenFromFragment, ApiError, checkToken, getToken, setToken, setUnauthorizedHandler } from "./api.js";
import { jobPage } from "./pages/job.js";
import { jobsPage } from "./pages/jobs.js";
import { overviewPage } from "./pages/overview.js";
import { queuePage } from "./pages/queue.js";
import { servicesPage } from "./pages/services.js";
import { usagePage } from "./pages/usage.js";
import { h } from "./ui.js";

// `?poll=500` polls faster (tests); never below 250 ms so a forgotten tab cannot hammer the head.
const POLL_MS = Math.max(250, Number(new URLSearchParams(window.location.search).get("poll")) || 2000);

const ROUTES = [
  { pattern: /^\/?$/, page: overviewPage, nav: "/" },
  { pattern: /^\/queue$/, page: queuePage, nav: "/queue" },
  { pattern: /^\/jobs$/, page: jobsPage, nav: "/jobs" },
  { pattern: /^\/jobs\/(\d+)$/, page: jobPage, nav: "/jobs" },
  { pattern: /^\/usage$/, page: usagePage, nav: "/usage" },
  { pattern: /^\/services$/, page: servicesPage, nav: "/services" },
];

const view = document.getElementById("view");
const statusEl = document.getElementById("status");
const signOut = document.getElementById("sign-out");
const dialog = document.getElementById("signin");
const form = document.getElementById("signin-form");
const signinMessage = document.getElementById("signin-message");

let current = null; // {page, route}
let timer = null;
let refreshing = false;
let signedOut = false;

function route() {
  const path = window.location.hash.replace(/^#/, "").split("?")[0] || "/";
  for (const r of ROUTES) {
    const m = path.match(r.pattern);
    if (m) return { ...r, params: m.slice(1) };
  }
  return null;
}

function show() {
  if (current) current.page.dispose?.();
  current = null;
  const r = route();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", r !== null && a.getAttribute("href") === `#${r.nav}`);
  }
  if (r === null) {
    view.replaceChildren(h("h1", {}, "Not found"), h("p", {}, "No such page. ", h("a", { href: "#/" }, "Overview")));
    return;
  }
  const root = h("div", { class: "page" });
  view.replaceChildren(root);
  current = { page: r.page(root, ...r.params), route: r };
  document.title = `${current.page.title} · gpucluster`;
  refresh();
}

async function refresh() {
  clearTimeout(timer);
  if (!current || refreshing) return;
  if (signedOut || document.hidden) {
    timer = setTimeout(refresh, POLL_MS);
    return;
  }
  refreshing = true;
  const page = current.page;
  try {
    await page.refresh();
    setStatus(`updated ${new Date().toLocaleTimeString()}`, false);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      // the sign-in form is up; polling resumes after it
    } else if (e.name !== "AbortError") {
      setStatus(e.message || String(e), true);
      if (!(e instanceof ApiError)) console.warn(e); // a bug of ours: visible to developers
    }
  } finally {
    refreshing = false;
    clearTimeout(timer);
    // a page opened meanwhile gets its first refresh at once
    if (current) timer = setTimeout(refresh, current.page === page ? POLL_MS : 0);
  }
}

function setStatus(text, bad) {
  statusEl.textContent = text;
  statusEl.classList.toggle("bad", bad);
  signOut.hidden = !getToken();
}

setUnauthorizedHandler((message) => {
  if (signedOut) return;
  signedOut = true;
  signinMessage.textContent = getToken()
    ? `The head refused the saved token: ${message}`
    : "This cluster needs an API token.";
  if (!dialog.open) dialog.showModal();
  document.getElementById("signin-token").focus();
});

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("signin-token").value.trim();
  if (!token) {
    signinMessage.textContent = "Paste a token first.";
    return;
  }
  // Checked before it is kept: a refused token stays out of storage, and costs one request.
  signinMessage.textContent = "Checking the token…";
  try {
    await checkToken(token);
  } catch (e) {
    signinMessage.textContent =
      e instanceof ApiError && e.status === 401 ? `The head refused this token: ${e.message}` : e.message || String(e);
    form.reset(); // the next paste replaces it
    document.getElementById("signin-token").focus();
    return;
  }
  setToken(token);
  form.reset();
  dialog.close();
  signedOut = false;
  refresh();
});

dialog.addEventListener("cancel", (event) => event.preventDefault()); // nothing works without it

signOut.addEventListener("click", () => {
  setToken("");
  window.location.reload();
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) refresh();
});

window.addEventListener("hashchange", () => {
  if (adoptTokenFromFragment()) signedOut = false;
  show();
});

adoptTokenFromFragment();
show();
