// The chat page: keeps the conversation, sends it to /v1/chat/completions with stream: true and
// shows the reply as its server-sent events arrive. It asks the server to leave out the oldest
// messages when the conversation outgrows the context ("truncate": "oldest") and notes when
// that happens. A server started with an API key answers the API's routes 401 without it: the
// page then asks for the key once and keeps it for this tab. No dependencies, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
let conversation = [];  // {role, content} messages of this conversation; "New chat" starts another
let model = null;
let controller = null;  // aborts the reply being streamed
let leftOut = 0;  // messages of this conversation the server has left out so far
let apiKey = sessionStorage.getItem("lmforge-api-key");  // asked for when the API answers 401

// fetch() of an API route with the key; on 401 asks for the key and tries again.
async function api(path, options = {}) {
  for (;;) {
    const headers = { ...(options.headers || {}) };
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    const key = window.prompt("This server needs its API key (lmforge serve --api-key):");
    if (!key) return response;
    apiKey = key.trim();
    sessionStorage.setItem("lmforge-api-key", apiKey);
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  div.textContent = text;  // model output is text, never markup
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setBusy(busy) {
  $("send").disabled = busy || model === null;
  $("stop").hidden = !busy;
}

async function loadModel() {
  try {
    const response = await api("/v1/models");
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    model = body.data[0].id;
    $("model").textContent = `${model} · context ${body.data[0].max_model_len} tokens`;
  } catch (error) {
    $("model").textContent = `no server: ${error}`;
  }
  setBusy(false);
}

// Yields the parsed `data:` payloads of a server-sent event stream.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

// Says so when the server left out more of this conversation's oldest messages than before.
function noteLeftOut(response, turns, reply) {
  const dropped = Number(response.headers.get("x-lmforge-dropped-messages") || 0);
  if (turns !== conversation || dropped <= leftOut) return;
  leftOut = dropped;
  const note = document.createElement("div");
  note.className = "message note";
  const messages = dropped === 1 ? "message no longer fits" : "messages no longer fit";
  note.textContent = `${dropped} earliest ${messages} the context and ${dropped === 1 ? "is" : "are"} left out`;
  reply.before(note);
}

async function send(text) {
  const turns = conversation;  // a reply that ends after "New chat" stays in its own conversation
  turns.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant streaming", "");
  controller = new AbortController();
  setBusy(true);
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      signal: controller.signal,
      body: JSON.stringify({
        model,
        messages: turns,
        stream: true,
        temperature: Number($("temperature").value),
        top_p: 0.95,
        max_tokens: Number($("max-tokens").value),
        truncate: "oldest",
      }),
    });
    if (!response.ok) {
      const body = await response.json();
      throw new Error(body.error ? body.error.message : response.statusText);
    }
    noteLeftOut(response, turns, reply);
    for await (const data of events(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices) {
        if (choice.delta.content) reply.textContent += choice.delta.content;
        if (choice.finish_reason) reply.dataset.finish = choice.finish_reason;
      }
      reply.scrollIntoView({ block: "end" });
    }
    turns.push({ role: "assistant", content: reply.textContent });
  } catch (error) {
    if (error.name === "AbortError") {
      turns.push({ role: "assistant", content: reply.textContent });  // stopped: keep what came
    } else {
      turns.pop();  // the failed turn is not part of the conversation
      reply.remove();
      addMessage("error", String(error.message || error));
    }
  } finally {
    reply.classList.remove("streaming");
    reply.dataset.done = "true";
    controller = null;
    setBusy(false);
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller || model === null) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("reset").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation = [];
  leftOut = 0;
  $("messages").replaceChildren();
  $("input").focus();
});
loadModel();
