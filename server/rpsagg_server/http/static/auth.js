// The dashboard's token (rpsagg-server --http-tokens): every API request carries it as
// "Authorization: Bearer <token>". The server answers 401 (no token) or 403 (a wrong
// one); the page then shows its token form. The token is kept in sessionStorage: it
// survives reloads of this tab and is gone when the tab closes.
"use strict";

const TOKEN_KEY = "rpsagg-dashboard-token";

class AuthNeeded extends Error {}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

// fetch() with the token; a 401/403 shows the form and throws AuthNeeded.
async function apiFetch(path) {
  const res = await fetch(path, { cache: "no-store", headers: authHeaders() });
  if (res.status === 401 || res.status === 403) {
    askToken(res.status === 403 ? "The server refused this token." : "");
    throw new AuthNeeded(`${path}: HTTP ${res.status}`);
  }
  return res;
}

function askToken(message) {
  const form = document.getElementById("auth");
  document.getElementById("auth-msg").textContent = message;
  if (form.hidden) {
    form.hidden = false;
    document.getElementById("auth-token").focus();
  }
}

// A download link (CSV, JSON): fetched with the token, then saved from a blob.
async function fetchDownload(href) {
  const res = await apiFetch(href);
  if (!res.ok) throw new Error(`${href}: HTTP ${res.status}`);
  return { type: res.headers.get("content-type"),
           disposition: res.headers.get("content-disposition"), blob: await res.blob() };
}

function wireAuth(onToken) {
  document.getElementById("auth").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("auth-token");
    const token = input.value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    input.value = "";
    document.getElementById("auth").hidden = true;
    onToken();
  });
  for (const link of document.querySelectorAll("a[download]")) {
    link.addEventListener("click", async (ev) => {
      ev.preventDefault();
      try {
        const got = await fetchDownload(link.getAttribute("href"));
        const url = URL.createObjectURL(got.blob);
        const a = document.createElement("a");
        a.href = url;
        const named = /filename="([^"]+)"/.exec(got.disposition || "");
        a.download = named ? named[1] : link.getAttribute("href").split("/").pop();
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(url), 10000);
      } catch (err) {
        if (!(err instanceof AuthNeeded)) link.title = String(err);
      }
    });
  }
}
