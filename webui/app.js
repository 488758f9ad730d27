"use strict";
/* augur's chat page.
 *
 * Conversations, settings and the API key live in this browser's
 * localStorage (the server keeps nothing). A reply streams from
 * POST /v1/chat/completions (SSE over fetch, read with a ReadableStream) and
 * is rendered as Markdown (markdown.js) as it arrives; Stop aborts the fetch,
 * which closes the connection, and the server cancels the generation when it
 * sees the hang-up. With stream_options.include_usage the last event carries
 * the token counts shown under each reply. A 401 opens a dialog for the key,
 * which then goes in every request as "Authorization: Bearer <key>". */
(() => {
  const KEYS = {
    conversations: "augur.conversations",
    current: "augur.current",
    settings: "augur.settings",
    apiKey: "augur.apiKey",
  };
  const DEFAULT_SETTINGS = { system: "", temperature: 0.7, max_tokens: 1024 };
  const TITLE_CHARS = 48;

  const $ = (id) => document.getElementById(id);
  const ui = {
    list: $("conversations"),
    messages: $("messages"),
    title: $("chat-title"),
    model: $("model-name"),
    prompt: $("prompt"),
    composer: $("composer"),
    send: $("send"),
    stop: $("stop"),
    notice: $("notice"),
    settings: $("settings"),
    settingsButton: $("settings-button"),
    system: $("system-prompt"),
    temperature: $("temperature"),
    maxTokens: $("max-tokens"),
    keyDialog: $("key-dialog"),
    keyForm: $("key-form"),
    keyInput: $("key-input"),
    keyReason: $("key-reason"),
  };

  const state = {
    conversations: [], /* most recently used first */
    currentId: null,
    settings: { ...DEFAULT_SETTINGS },
    model: null,
    streaming: null, /* {conv, reply, controller} while a reply streams */
  };

  /* ---- storage ---- */

  function loadJSON(key, fallback) {
    try {
      const v = localStorage.getItem(key);
      return v === null ? fallback : JSON.parse(v);
    } catch (e) {
      return fallback;
    }
  }

  function saveJSON(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
      return true;
    } catch (e) {
      showNotice("Could not save in this browser's storage (" + e.name + "): older conversations may need deleting.");
      return false;
    }
  }

  /* Keeps only well-formed conversations: the storage may hold anything. */
  function validConversations(v) {
    if (!Array.isArray(v)) return [];
    return v.filter(
      (c) =>
        c &&
        typeof c.id === "string" &&
        typeof c.title === "string" &&
        Array.isArray(c.messages) &&
        c.messages.every((m) => m && (m.role === "user" || m.role === "assistant") && typeof m.content === "string")
    );
  }

  function persist() {
    saveJSON(KEYS.conversations, state.conversations);
    saveJSON(KEYS.current, state.currentId);
  }

  function apiKey() {
    const k = loadJSON(KEYS.apiKey, "");
    return typeof k === "string" ? k : "";
  }

  /* ---- conversations ---- */

  const current = () => state.conversations.find((c) => c.id === state.currentId) || null;

  function newId() {
    const a = new Uint32Array(2);
    crypto.getRandomValues(a);
    return Date.now().toString(36) + "-" + a[0].toString(36) + a[1].toString(36);
  }

  function createConversation() {
    const conv = { id: newId(), title: "New chat", named: false, created: Date.now(), updated: Date.now(), messages: [] };
    state.conversations.unshift(conv);
    state.currentId = conv.id;
    return conv;
  }

  /* Moves `conv` to the top of the list. */
  function touch(conv) {
    conv.updated = Date.now();
    const i = state.conversations.indexOf(conv);
    if (i > 0) {
      state.conversations.splice(i, 1);
      state.conversations.unshift(conv);
    }
  }

  /* The title a conversation gets from its first message. */
  function autoTitle(text) {
    const line = text.replace(/\s+/g, " ").trim();
    if (line.length <= TITLE_CHARS) return line || "New chat";
    const cut = line.slice(0, TITLE_CHARS);
    const space = cut.lastIndexOf(" ");
    return (space > TITLE_CHARS / 2 ? cut.slice(0, space) : cut) + "\u2026";
  }

  function selectConversation(id) {
    state.currentId = id;
    saveJSON(KEYS.current, id);
    document.body.classList.remove("sidebar-open");
    render();
    ui.prompt.focus();
  }

  function deleteConversation(conv) {
    if (!confirm('Delete "' + conv.title + '"?')) return;
    if (state.streaming && state.streaming.conv === conv) state.streaming.controller.abort();
    state.conversations = state.conversations.filter((c) => c !== conv);
    if (state.currentId === conv.id) state.currentId = state.conversations.length ? state.conversations[0].id : null;
    persist();
    render();
  }

  function startRename(conv, li) {
    const input = document.createElement("input");
    input.className = "conv-title-input";
    input.value = conv.title;
    input.setAttribute("aria-label", "Conversation title");
    let finished = false;
    const finish = (keep) => {
      if (finished) return;
      finished = true;
      const title = input.value.replace(/\s+/g, " ").trim();
      if (keep && title) {
        conv.title = title;
        conv.named = true;
        persist();
      }
      render();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") finish(true);
      else if (e.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
    li.replaceChild(input, li.querySelector(".conv-title"));
    input.focus();
    input.select();
  }

  /* ---- rendering ---- */

  function render() {
    renderList();
    renderMessages();
  }

  function renderList() {
    ui.list.replaceChildren();
    for (const conv of state.conversations) {
      const li = document.createElement("li");
      li.className = "conv" + (conv.id === state.currentId ? " active" : "");
      li.dataset.id = conv.id;
      const title = document.createElement("button");
      title.type = "button";
      title.className = "conv-title";
      title.textContent = conv.title;
      title.title = conv.title;
      title.addEventListener("click", () => selectConversation(conv.id));
      const rename = document.createElement("button");
      rename.type = "button";
      rename.className = "conv-rename";
      rename.textContent = "\u270E";
      rename.title = "Rename";
      rename.setAttribute("aria-label", "Rename");
      rename.addEventListener("click", () => startRename(conv, li));
      const del = document.createElement("button");
      del.type = "button";
      del.className = "conv-delete";
      del.textContent = "\u00D7";
      del.title = "Delete";
      del.setAttribute("aria-label", "Delete");
      del.addEventListener("click", () => deleteConversation(conv));
      li.append(title, rename, del);
      ui.list.appendChild(li);
    }
  }

  function renderMessages() {
    const conv = current();
    ui.title.textContent = conv ? conv.title : "augur";
    document.title = conv ? conv.title + " \u2014 augur" : "augur";
    ui.messages.replaceChildren();
    if (!conv || !conv.messages.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "Send a message to start a conversation.";
      ui.messages.appendChild(p);
      return;
    }
    for (const m of conv.messages) ui.messages.appendChild(messageElement(m));
    ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function messageElement(m) {
    const div = document.createElement("div");
    div.className = "msg " + m.role;
    const body = document.createElement("div");
    body.className = "msg-body";
    div.appendChild(body);
    if (m.role === "user") body.textContent = m.content;
    else {
      body.appendChild(AugurMarkdown.render(m.content));
      const streaming = state.streaming && state.streaming.reply === m;
      div.classList.toggle("streaming", !!streaming);
      if (m.error) {
        const e = document.createElement("div");
        e.className = "msg-error";
        e.textContent = m.error;
        div.appendChild(e);
      }
      if (m.stats) {
        const s = document.createElement("div");
        s.className = "msg-stats";
        s.textContent = statsText(m.stats);
        div.appendChild(s);
      }
      if (streaming) state.streaming.el = div;
    }
    return div;
  }

  function statsText(st) {
    const parts = [];
    if (st.stopped) parts.push("stopped");
    if (st.completion_tokens !== undefined) parts.push(st.completion_tokens + " tokens");
    if (st.tokens_per_s) parts.push(st.tokens_per_s.toFixed(1) + " tok/s");
    if (st.prompt_tokens !== undefined)
      parts.push((st.cached_tokens || 0) + "/" + st.prompt_tokens + " prompt tokens cached");
    if (st.first_token_ms !== undefined) parts.push((st.first_token_ms / 1000).toFixed(2) + " s to first token");
    if (st.finish_reason === "length") parts.push("cut at max tokens");
    if (st.stopped && st.elapsed_ms !== undefined) parts.push("after " + (st.elapsed_ms / 1000).toFixed(1) + " s");
    return parts.join(" \u00B7 ");
  }

  /* Redraws the streaming reply at most once per frame. */
  let frameQueued = false;
  function scheduleReplyRender() {
    if (frameQueued) return;
    frameQueued = true;
    requestAnimationFrame(() => {
      frameQueued = false;
      const s = state.streaming;
      if (!s || !s.el || !s.el.isConnected) return;
      const nearBottom = ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 80;
      s.el.querySelector(".msg-body").replaceChildren(AugurMarkdown.render(s.reply.content));
      if (nearBottom) ui.messages.scrollTop = ui.messages.scrollHeight;
    });
  }

  function showNotice(text) {
    ui.notice.textContent = text;
    ui.notice.hidden = !text;
  }

  function setStreaming(on) {
    ui.send.hidden = on;
    ui.stop.hidden = !on;
  }

  /* ---- the API ---- */

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = apiKey();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  async function errorText(resp) {
    let msg = "HTTP " + resp.status;
    try {
      const j = await resp.json();
      if (j && j.error && j.error.message) msg += ": " + j.error.message;
    } catch (e) {
      /* not JSON: the status says enough */
    }
    return msg;
  }

  /* Opens the key dialog; resolves true once a key is stored, false on
   * cancel. One dialog at a time: concurrent callers share it. */
  let keyPrompt = null;
  function askForKey(reason) {
    if (keyPrompt) return keyPrompt;
    keyPrompt = new Promise((resolve) => {
      ui.keyReason.textContent = reason;
      ui.keyInput.value = "";
      const done = (ok) => {
        ui.keyForm.removeEventListener("submit", onSubmit);
        ui.keyDialog.removeEventListener("cancel", onCancel);
        $("key-cancel").removeEventListener("click", onCancel);
        if (ui.keyDialog.open) ui.keyDialog.close();
        keyPrompt = null;
        resolve(ok);
      };
      const onSubmit = (e) => {
        e.preventDefault();
        const key = ui.keyInput.value.trim();
        if (!key) return;
        saveJSON(KEYS.apiKey, key);
        done(true);
      };
      const onCancel = (e) => {
        e.preventDefault();
        done(false);
      };
      ui.keyForm.addEventListener("submit", onSubmit);
      ui.keyDialog.addEventListener("cancel", onCancel);
      $("key-cancel").addEventListener("click", onCancel);
      ui.keyDialog.showModal();
      ui.keyInput.focus();
    });
    return keyPrompt;
  }

  /* fetch() that asks for the key on a 401 and tries again with it. */
  async function apiFetch(path, init) {
    for (;;) {
      const resp = await fetch(path, { ...init, headers: headers() });
      if (resp.status !== 401) return resp;
      const reason = apiKey() ? "The server did not accept that key." : "This server needs an API key.";
      if (!(await askForKey(reason))) return resp;
    }
  }

  async function loadModel() {
    try {
      const resp = await apiFetch("/v1/models", { method: "GET" });
      if (!resp.ok) {
        ui.model.textContent = "";
        return;
      }
      const j = await resp.json();
      state.model = j && j.data && j.data[0] && typeof j.data[0].id === "string" ? j.data[0].id : null;
      ui.model.textContent = state.model || "";
    } catch (e) {
      ui.model.textContent = "server unreachable";
    }
  }

  /* Reads an SSE body, calling onEvent with each JSON event until [DONE].
   * Throws if the stream ends before [DONE] or carries malformed JSON. */
  async function readEvents(body, onEvent) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (value) buf += decoder.decode(value, { stream: true });
        if (done) buf += decoder.decode();
        /* a CR at the very end may be half of a CRLF: leave it for the next read */
        const keep = !done && buf.endsWith("\r") ? 1 : 0;
        let text = buf.slice(0, buf.length - keep).replace(/\r\n?/g, "\n");
        buf = text + buf.slice(buf.length - keep);
        for (let sep = buf.indexOf("\n\n"); sep >= 0; sep = buf.indexOf("\n\n")) {
          const block = buf.slice(0, sep);
          buf = buf.slice(sep + 2);
          const data = block
            .split("\n")
            .filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).replace(/^ /, ""))
            .join("\n");
          if (!data) continue;
          if (data === "[DONE]") return;
          let event;
          try {
            event = JSON.parse(data);
          } catch (e) {
            throw new Error("the server sent a malformed event");
          }
          onEvent(event);
        }
        if (done) throw new Error("the connection closed before the reply was complete");
      }
    } finally {
      reader.releaseLock();
    }
  }

  function requestMessages(conv, reply) {
    const msgs = [];
    const system = state.settings.system.trim();
    if (system) msgs.push({ role: "system", content: system });
    for (const m of conv.messages) {
      if (m === reply) break;
      /* a failed reply is not part of the conversation the model sees */
      if (m.role === "assistant" && m.error && !m.content) continue;
      msgs.push({ role: m.role, content: m.content });
    }
    return msgs;
  }

  async function streamReply(conv, reply) {
    const controller = new AbortController();
    state.streaming = { conv, reply, controller, el: null };
    setStreaming(true);
    render();
    const body = {
      messages: requestMessages(conv, reply),
      stream: true,
      stream_options: { include_usage: true },
      temperature: state.settings.temperature,
    };
    if (state.settings.max_tokens) body.max_tokens = state.settings.max_tokens;
    if (state.model) body.model = state.model;
    const t0 = performance.now();
    let tFirst = null;
    let tLast = null;
    let usage = null;
    let finish = null;
    try {
      const resp = await apiFetch("/v1/chat/completions", {
        method: "POST",
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!resp.ok) throw new Error(await errorText(resp));
      await readEvents(resp.body, (ev) => {
        if (ev.error) throw new Error(ev.error.message || "the server reported an error");
        const choice = ev.choices && ev.choices[0];
        if (choice && choice.delta && typeof choice.delta.content === "string" && choice.delta.content) {
          tLast = performance.now();
          if (tFirst === null) tFirst = tLast;
          reply.content += choice.delta.content;
          scheduleReplyRender();
        }
        if (choice && choice.finish_reason) finish = choice.finish_reason;
        if (ev.usage) usage = ev.usage;
      });
      reply.stats = replyStats(usage, finish, t0, tFirst, tLast);
    } catch (e) {
      if (e.name === "AbortError") {
        reply.stats = { stopped: true, elapsed_ms: performance.now() - t0 };
      } else {
        reply.error = "Error: " + e.message;
      }
    } finally {
      state.streaming = null;
      setStreaming(false);
      touch(conv);
      persist();
      render();
    }
  }

  /* Token figures of a finished reply. The rate is of decoding: tokens
   * after the first over the time since the first arrived. */
  function replyStats(usage, finish, t0, tFirst, tLast) {
    const st = { finish_reason: finish };
    if (tFirst !== null) st.first_token_ms = tFirst - t0;
    if (usage) {
      st.completion_tokens = usage.completion_tokens;
      st.prompt_tokens = usage.prompt_tokens;
      const d = usage.prompt_tokens_details;
      st.cached_tokens = d && typeof d.cached_tokens === "number" ? d.cached_tokens : 0;
      const n = usage.completion_tokens;
      if (n > 1 && tLast > tFirst) st.tokens_per_s = (n - 1) / ((tLast - tFirst) / 1000);
      else if (n > 0 && tLast !== null && tLast > t0) st.tokens_per_s = n / ((tLast - t0) / 1000);
    }
    return st;
  }

  async function send() {
    const text = ui.prompt.value;
    if (!text.trim() || state.streaming) return;
    let conv = current();
    if (!conv) conv = createConversation();
    conv.messages.push({ role: "user", content: text });
    if (!conv.named && conv.messages.filter((m) => m.role === "user").length === 1) conv.title = autoTitle(text);
    const reply = { role: "assistant", content: "" };
    conv.messages.push(reply);
    ui.prompt.value = "";
    showNotice("");
    touch(conv);
    persist();
    await streamReply(conv, reply);
  }

  /* ---- settings ---- */

  function loadSettings() {
    const s = loadJSON(KEYS.settings, {});
    const out = { ...DEFAULT_SETTINGS };
    if (s && typeof s.system === "string") out.system = s.system;
    if (s && typeof s.temperature === "number" && s.temperature >= 0 && s.temperature <= 2) out.temperature = s.temperature;
    if (s && (s.max_tokens === null || (Number.isInteger(s.max_tokens) && s.max_tokens > 0))) out.max_tokens = s.max_tokens;
    state.settings = out;
    ui.system.value = out.system;
    ui.temperature.value = String(out.temperature);
    ui.maxTokens.value = out.max_tokens ? String(out.max_tokens) : "";
  }

  function saveSettings() {
    const t = parseFloat(ui.temperature.value);
    if (Number.isFinite(t)) state.settings.temperature = Math.min(2, Math.max(0, t));
    const n = parseInt(ui.maxTokens.value, 10);
    state.settings.max_tokens = ui.maxTokens.value.trim() === "" ? null : Number.isFinite(n) && n > 0 ? n : state.settings.max_tokens;
    state.settings.system = ui.system.value;
    saveJSON(KEYS.settings, state.settings);
  }

  /* ---- wiring ---- */

  function init() {
    state.conversations = validConversations(loadJSON(KEYS.conversations, []));
    const cur = loadJSON(KEYS.current, null);
    state.currentId = state.conversations.some((c) => c.id === cur) ? cur : state.conversations.length ? state.conversations[0].id : null;
    loadSettings();

    ui.composer.addEventListener("submit", (e) => {
      e.preventDefault();
      send();
    });
    ui.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    ui.stop.addEventListener("click", () => state.streaming && state.streaming.controller.abort());
    $("new-chat").addEventListener("click", () => {
      if (!current() || current().messages.length) createConversation();
      persist();
      selectConversation(state.currentId);
    });
    $("toggle-sidebar").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
    ui.settingsButton.addEventListener("click", () => {
      ui.settings.hidden = !ui.settings.hidden;
      ui.settingsButton.setAttribute("aria-expanded", String(!ui.settings.hidden));
    });
    for (const input of [ui.system, ui.temperature, ui.maxTokens]) input.addEventListener("change", saveSettings);
    ui.system.addEventListener("input", saveSettings);
    $("forget-key").addEventListener("click", () => {
      localStorage.removeItem(KEYS.apiKey);
      showNotice("The API key is forgotten; the next request will ask for one if the server needs it.");
    });
    /* another tab changed the conversations: take its list unless we are mid-reply */
    window.addEventListener("storage", (e) => {
      if (e.key !== KEYS.conversations || state.streaming) return;
      state.conversations = validConversations(loadJSON(KEYS.conversations, []));
      if (!current()) state.currentId = state.conversations.length ? state.conversations[0].id : null;
      render();
    });

    render();
    loadModel();
    ui.prompt.focus();
  }

  init();
})();
