// Runs the Streams page's script under Node over given route responses, and prints, as JSON, every string the
// script gave to innerHTML or textContent. Input on stdin: [script, {url: json}, location.hash].
"use strict";
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const [script, responses, hash] = input;
const sinks = [];
const elements = {};
const element = () => ({
  set innerHTML(html) { sinks.push(["html", html]); },
  set textContent(text) { sinks.push(["text", text]); },
});
globalThis.document = {getElementById: (id) => (elements[id] ??= element()), addEventListener() {}};
globalThis.location = {hash};
globalThis.window = {addEventListener() {}};
globalThis.fetch = async (url) => url in responses
  ? {ok: true, json: async () => responses[url]}
  : {ok: false, status: 404, statusText: "no such route", json: async () => ({})};
// Printed once the page's promises have all settled: nothing is left for the event loop then.
process.once("beforeExit", () => process.stdout.write(JSON.stringify(sinks)));
(0, eval)(script);
