// The oars playground: one request at a time, streamed, with the raw events and the stream
// validator's verdict beside it. No framework, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const DEMO_TOOL = {
  type: "function", name: "get_weather", description: "The current weather in a city.",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};
let previousId = null;   // the response the next request continues
let pendingCall = null;  // a function call waiting for its output

function setStatus(text) { $("status").textContent = text; }

// Every call carries the API key typed in (kept in this browser only) when there is one.
function api(path, options = {}) {
  const key = $("api_key").value.trim();
  const headers = { ...(options.headers || {}) };
  if (key) headers.authorization = `Bearer ${key}`;
  return fetch(path, { ...options, headers });
}
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

async function loadModels() {
  const response = await api("/v1/models");
  if (!response.ok) {
    setStatus(response.status === 401 ? "an API key is needed" : `error ${response.status}`);
    return;
  }
  const body = await response.json();
  for (const m of body.data) $("model").append(new Option(m.id, m.id));
}

function requestBody(input) {
  const body = { model: $("model").value, input, stream: true, store: true,
                 max_output_tokens: Number($("max_tokens").value) || 256 };
  const instructions = $("instructions").value.trim();
  if (instructions) body.instructions = instructions;
  if (previousId) body.previous_response_id = previousId;
  if ($("tool").checked) {
    body.tools = [DEMO_TOOL];
    // after a tool's output the model answers in words, whatever the choice was
    const afterOutput = Array.isArray(input);
    body.tool_choice = afterOutput ? "auto" : $("tool_choice").value;
  }
  const schema = $("schema").value.trim();
  if (schema) {
    body.text = { format: { type: "json_schema", name: "answer", schema: JSON.parse(schema), strict: true } };
  }
  return body;
}

// One turn on screen: what the user sent, then the response's items as they stream.
class Turn {
  constructor(label) {
    this.root = el("div", "turn");
    this.root.append(el("div", "who", label));
    this.items = {};  // output_index → element
    this.meta = el("div", "meta");
    this.root.append(this.meta);
    $("transcript").append(this.root);
  }
  item(index, cls) {
    if (!this.items[index]) {
      this.items[index] = el("div", cls, "");
      this.root.insertBefore(this.items[index], this.meta);
    }
    return this.items[index];
  }
  apply(ev) {
    switch (ev.type) {
      case "response.output_item.added":
        if (ev.item.type === "function_call" || ev.item.type === "custom_tool_call") {
          this.item(ev.output_index, "call").textContent = `${ev.item.name}(`;
        } else if (ev.item.type === "reasoning") {
          this.item(ev.output_index, "reasoning");
        } else {
          this.item(ev.output_index, "text");
        }
        break;
      case "response.reasoning_text.delta":
      case "response.reasoning_summary_text.delta":
        this.item(ev.output_index, "reasoning").textContent += ev.delta;
        break;
      case "response.output_text.delta":
      case "response.refusal.delta":
        this.item(ev.output_index, "text").textContent += ev.delta;
        break;
      case "response.function_call_arguments.delta":
      case "response.custom_tool_call_input.delta":
        this.item(ev.output_index, "call").textContent += ev.delta;
        break;
      case "response.output_item.done":
        if (ev.item.type === "function_call" || ev.item.type === "custom_tool_call") {
          this.item(ev.output_index, "call").textContent += ")";
          pendingCall = ev.item;
        }
        break;
      case "response.completed":
      case "response.incomplete":
      case "response.failed":
      case "response.cancelled":
        this.finish(ev.response);
        break;
      case "error":
        this.root.append(el("div", "error", `error: ${ev.message || JSON.stringify(ev)}`));
        break;
    }
  }
  finish(response) {
    const usage = response.usage || {};
    this.meta.textContent = `${response.id} · ${response.status} · ` +
      `${usage.input_tokens ?? "?"} in / ${usage.output_tokens ?? "?"} out`;
    if (response.error) this.root.append(el("div", "error", response.error.message));
  }
}

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      yield block;
    }
  }
  if (buffer.trim()) yield buffer;
}

async function run(input, label) {
  let body;
  try {
    body = requestBody(input);
  } catch (err) {
    setStatus("the JSON schema is not JSON");
    return;
  }
  $("send").disabled = true;
  $("tool_output_box").hidden = true;
  pendingCall = null;
  $("events").textContent = "";
  $("verdict").textContent = "";
  $("verdict").className = "verdict";
  const turn = new Turn(label);
  setStatus("streaming");
  let raw = "";
  let final = null;
  try {
    const response = await api("/v1/responses", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
    });
    if (!response.ok) {
      const error = await response.json();
      turn.root.append(el("div", "error", `${response.status}: ${error.error.message}`));
      setStatus(`error ${response.status}`);
      return;
    }
    for await (const block of sseEvents(response)) {
      raw += block + "\n\n";
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      const ev = JSON.parse(data);
      $("events").textContent += `${ev.sequence_number ?? ""} ${ev.type}\n`;
      turn.apply(ev);
      if (ev.response && ["completed", "incomplete", "failed", "cancelled"].includes(ev.response.status)) final = ev.response;
    }
    setStatus(final ? final.status : "ended without a terminal event");
    if (final) {
      previousId = final.id;
      $("continuing").textContent = `continuing ${final.id}`;
    }
    if (pendingCall) {
      $("tool_call_name").textContent = `${pendingCall.name} (${pendingCall.call_id})`;
      $("tool_output_box").hidden = false;
    }
    await showVerdict(raw);
    loadStored();
  } catch (err) {
    setStatus(`error: ${err.message}`);
  } finally {
    $("send").disabled = false;
  }
}

async function showVerdict(raw) {
  const verdict = await (await api("/oars/validate", {
    method: "POST", headers: { "content-type": "text/event-stream" }, body: raw,
  })).json();
  $("verdict").textContent = verdict.ok
    ? `valid: ${verdict.events} events`
    : `${verdict.violations.length} violations: ${verdict.violations.join("; ")}`;
  $("verdict").className = `verdict ${verdict.ok ? "ok" : "bad"}`;
}

async function loadStored() {
  const response = await api("/oars/responses?limit=20");
  $("stored").textContent = "";
  if (!response.ok) {
    $("stored").append(el("li", "meta", "this server keeps no responses"));
    return;
  }
  for (const r of (await response.json()).data) {
    const text = r.output.filter((i) => i.type === "message")
      .flatMap((i) => i.content.map((c) => c.text || "")).join(" ").slice(0, 60);
    const li = el("li", "", `${r.id.slice(0, 14)}… ${r.status} ${text}`);
    li.dataset.id = r.id;
    li.addEventListener("click", () => openStored(r.id));
    $("stored").append(li);
  }
}

async function openStored(id) {
  const response = await (await api(`/v1/responses/${id}`)).json();
  $("opened").hidden = false;
  $("opened").textContent = JSON.stringify(response, null, 2);
  previousId = id;
  $("continuing").textContent = `continuing ${id}`;
}

$("send").addEventListener("click", () => {
  const text = $("message").value.trim();
  if (!text) return;
  $("message").value = "";
  run(text, `you: ${text}`);
});
$("send_tool_output").addEventListener("click", () => {
  if (!pendingCall) return;
  const output = $("tool_output").value;
  run([{ type: "function_call_output", call_id: pendingCall.call_id, output }], `tool output: ${output}`);
});
$("new").addEventListener("click", () => {
  previousId = null;
  pendingCall = null;
  $("transcript").textContent = "";
  $("continuing").textContent = "";
  $("tool_output_box").hidden = true;
  setStatus("idle");
});
$("refresh").addEventListener("click", loadStored);
$("api_key").value = localStorage.getItem("oars_api_key") || "";
$("api_key").addEventListener("change", () => {
  localStorage.setItem("oars_api_key", $("api_key").value.trim());
  $("model").textContent = "";
  loadModels().then(loadStored);
});
loadModels().then(loadStored);
