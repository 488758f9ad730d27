"use strict";
/* A small Markdown renderer for model replies.
 *
 * AugurMarkdown.render(text) returns a DocumentFragment built with
 * createElement and text nodes only: no HTML string is ever parsed, so
 * markup in a reply (<script>, <img onerror>, ...) shows as the text it is.
 * Links keep only http:, https: and mailto: targets; anything else stays
 * plain text. Images become links (the page loads nothing from elsewhere).
 *
 * Covered (the CommonMark rules where a model's replies need them): ATX and
 * setext headings, paragraphs (a single newline is a line break, as chat
 * output means it), emphasis with * and _ (intraword _ is literal), strong,
 * ~~strikethrough~~, `code spans`, fenced code blocks with a language label
 * and a Copy button, indented lists (bullet and ordered, nested, tight or
 * loose), block quotes, thematic breaks, GFM tables, [links](url "title"),
 * <autolinks> and bare http(s) URLs, backslash escapes. An unclosed fence
 * runs to the end, so a half-streamed code block already shows as code.
 * Not covered: raw HTML (shown as text), character references (&amp; shows
 * as written), indented code blocks, reference-style links, and emphasis
 * corner cases such as **a* (left as written).
 *
 * Hostile input can make it neither slow nor deep: a delimiter or backtick
 * run that found no closer is not searched for again in the same text, and
 * nesting is capped (MAX_DEPTH). */
(function (global) {
  const MAX_DEPTH = 12;
  const PUNCT = /[!-/:-@[-`{-~]/; /* ASCII punctuation: what a backslash escapes */
  const WORD = /[\p{L}\p{N}]/u;
  const SPACE = /\s/;

  const FENCE = /^( {0,3})(`{3,}|~{3,})(.*)$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const THEMATIC = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const SETEXT = /^ {0,3}(=+|-+)[ \t]*$/;
  const QUOTE = /^ {0,3}> ?/;
  const LIST_ITEM = /^( {0,3})([-+*]|\d{1,9}[.)])([ \t]+|$)(.*)$/;
  const TABLE_DELIM = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
  const SAFE_SCHEME = /^(https?:|mailto:)/i;

  function el(tag, cls) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    return e;
  }

  const isBlank = (line) => /^[ \t]*$/.test(line);

  /* Leading tabs become spaces to the next multiple of 4. */
  function expandTabs(line) {
    if (line.indexOf("\t") < 0) return line;
    let out = "";
    let i = 0;
    for (; i < line.length && (line[i] === " " || line[i] === "\t"); i++)
      out += line[i] === " " ? " " : " ".repeat(4 - (out.length % 4));
    return out + line.slice(i);
  }

  const indentOf = (line) => line.length - line.replace(/^ +/, "").length;

  /* ---- blocks ---- */

  function fenceOpen(line) {
    const m = FENCE.exec(line);
    if (!m || (m[2][0] === "`" && m[3].indexOf("`") >= 0)) return null;
    return { indent: m[1].length, fence: m[2], lang: m[3].trim().split(/\s+/)[0] || "" };
  }

  function listItem(line) {
    if (THEMATIC.test(line)) return null;
    const m = LIST_ITEM.exec(line);
    if (!m) return null;
    const ordered = /\d/.test(m[2]);
    const gap = m[3].length;
    /* a gap over 4 spaces means the content starts with 1 space (CommonMark) */
    const pad = gap === 0 ? 1 : gap > 4 ? 1 : gap;
    const text = gap > 4 ? m[3].slice(1) + m[4] : m[4];
    return {
      ordered,
      marker: ordered ? m[2].slice(-1) : m[2],
      start: ordered ? parseInt(m[2], 10) : 1,
      contentIndent: m[1].length + m[2].length + pad,
      text,
    };
  }

  function splitRow(line) {
    let s = line.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
    const cells = [];
    let cur = "";
    for (let i = 0; i < s.length; i++) {
      if (s[i] === "\\" && s[i + 1] === "|") {
        cur += "|";
        i++;
      } else if (s[i] === "|") {
        cells.push(cur.trim());
        cur = "";
      } else cur += s[i];
    }
    cells.push(cur.trim());
    return cells;
  }

  function tableStart(lines, i) {
    if (i + 1 >= lines.length || lines[i].indexOf("|") < 0 || !TABLE_DELIM.test(lines[i + 1])) return false;
    if (lines[i + 1].indexOf("|") < 0 && lines[i + 1].indexOf("-") < 0) return false;
    return splitRow(lines[i]).length === splitRow(lines[i + 1]).length;
  }

  /* Does `line` end a paragraph that it follows? */
  function interrupts(line) {
    if (fenceOpen(line) || HEADING.test(line) || THEMATIC.test(line) || QUOTE.test(line)) return true;
    const li = listItem(line);
    return !!li && li.text.trim() !== "" && (!li.ordered || li.start === 1);
  }

  function renderBlocks(lines, parent, depth, tight) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (isBlank(line)) {
        i++;
        continue;
      }
      const fence = fenceOpen(line);
      if (fence) {
        i = codeBlock(lines, i, fence, parent);
        continue;
      }
      const h = HEADING.exec(line);
      if (h) {
        const e = el("h" + h[1].length);
        renderInline((h[2] || "").replace(/(^|[ \t]+)#+$/, ""), e, depth);
        parent.appendChild(e);
        i++;
        continue;
      }
      if (THEMATIC.test(line)) {
        parent.appendChild(el("hr"));
        i++;
        continue;
      }
      if (depth < MAX_DEPTH && QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && QUOTE.test(lines[i])) inner.push(lines[i++].replace(QUOTE, ""));
        const q = el("blockquote");
        renderBlocks(inner, q, depth + 1, false);
        parent.appendChild(q);
        continue;
      }
      if (depth < MAX_DEPTH && listItem(line)) {
        i = list(lines, i, parent, depth);
        continue;
      }
      if (tableStart(lines, i)) {
        i = table(lines, i, parent, depth);
        continue;
      }
      i = paragraph(lines, i, parent, depth, tight);
    }
  }

  function codeBlock(lines, i, fence, parent) {
    const body = [];
    const close = new RegExp("^ {0,3}" + (fence.fence[0] === "`" ? "`" : "~") + "{" + fence.fence.length + ",}[ \\t]*$");
    for (i++; i < lines.length && !close.test(lines[i]); i++) {
      const ind = Math.min(indentOf(lines[i]), fence.indent);
      body.push(lines[i].slice(ind));
    }
    const wrap = el("div", "codeblock");
    const head = el("div", "codeblock-head");
    const label = el("span", "codeblock-lang");
    label.textContent = fence.lang;
    const copy = el("button", "copy");
    copy.type = "button";
    copy.textContent = "Copy";
    head.append(label, copy);
    const pre = el("pre");
    const code = el("code");
    if (fence.lang) code.className = "language-" + fence.lang;
    code.textContent = body.length ? body.join("\n") + "\n" : "";
    copy.addEventListener("click", () => copyText(code.textContent, copy));
    pre.appendChild(code);
    wrap.append(head, pre);
    parent.appendChild(wrap);
    return i + 1; /* past the closing fence, or past the end */
  }

  function list(lines, i, parent, depth) {
    const first = listItem(lines[i]);
    const e = el(first.ordered ? "ol" : "ul");
    if (first.ordered && first.start !== 1) e.start = first.start;
    const items = [];
    let loose = false;
    while (i < lines.length) {
      const li = listItem(lines[i]);
      if (!li || li.ordered !== first.ordered || li.marker !== first.marker) break;
      const body = [li.text];
      let blankBefore = false;
      for (i++; i < lines.length; i++) {
        const l = lines[i];
        if (isBlank(l)) {
          body.push("");
          blankBefore = true;
          continue;
        }
        if (indentOf(l) >= li.contentIndent) {
          body.push(l.slice(li.contentIndent));
          blankBefore = false;
          continue;
        }
        /* a lazy continuation of the item's paragraph */
        if (!blankBefore && !interrupts(l) && !listItem(l) && body[body.length - 1] !== "") {
          body.push(l.trim());
          continue;
        }
        break;
      }
      let trailingBlank = false;
      while (body.length && body[body.length - 1] === "") {
        body.pop();
        trailingBlank = true;
      }
      if (body.indexOf("") >= 0 && !insideFence(body)) loose = true;
      if (trailingBlank && i < lines.length) {
        const next = listItem(lines[i]);
        if (next && next.ordered === first.ordered && next.marker === first.marker) loose = true;
      }
      items.push(body);
    }
    for (const body of items) {
      const item = el("li");
      renderBlocks(body, item, depth + 1, !loose);
      e.appendChild(item);
    }
    parent.appendChild(e);
    return i;
  }

  /* True when every blank line of an item's body sits inside a fenced code
   * block (such blanks do not make the list loose). */
  function insideFence(body) {
    let open = null;
    for (const l of body) {
      if (open) {
        if (new RegExp("^ {0,3}" + open[0] + "{" + open.length + ",}[ \\t]*$").test(l)) open = null;
      } else {
        const f = fenceOpen(l);
        if (f) open = f.fence;
        else if (l === "") return false;
      }
    }
    return true;
  }

  function table(lines, i, parent, depth) {
    const head = splitRow(lines[i]);
    const align = splitRow(lines[i + 1]).map((c) =>
      c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : ""
    );
    const t = el("table");
    const thead = el("thead");
    const tr = el("tr");
    head.forEach((cell, k) => tr.appendChild(tableCell("th", cell, align[k], depth)));
    thead.appendChild(tr);
    t.appendChild(thead);
    const tbody = el("tbody");
    for (i += 2; i < lines.length && !isBlank(lines[i]) && lines[i].indexOf("|") >= 0 && !interrupts(lines[i]); i++) {
      const row = splitRow(lines[i]);
      const r = el("tr");
      for (let k = 0; k < head.length; k++) r.appendChild(tableCell("td", row[k] || "", align[k], depth));
      tbody.appendChild(r);
    }
    if (tbody.childNodes.length) t.appendChild(tbody);
    const wrap = el("div", "table-wrap");
    wrap.appendChild(t);
    parent.appendChild(wrap);
    return i;
  }

  function tableCell(tag, text, align, depth) {
    const c = el(tag);
    if (align) c.style.textAlign = align; /* CSSOM, which the page's CSP allows */
    renderInline(text, c, depth);
    return c;
  }

  function paragraph(lines, i, parent, depth, tight) {
    const buf = [];
    for (; i < lines.length && !isBlank(lines[i]); i++) {
      if (buf.length) {
        const st = SETEXT.exec(lines[i]);
        if (st) {
          const h = el(st[1][0] === "=" ? "h1" : "h2");
          renderInline(buf.join("\n"), h, depth);
          parent.appendChild(h);
          return i + 1;
        }
        if (interrupts(lines[i]) || tableStart(lines, i)) break;
      }
      buf.push(lines[i].replace(/^[ \t]+/, "").replace(/[ \t]+$/, ""));
    }
    if (tight) renderInline(buf.join("\n"), parent, depth);
    else {
      const p = el("p");
      renderInline(buf.join("\n"), p, depth);
      parent.appendChild(p);
    }
    return i;
  }

  /* ---- inlines ---- */

  function runLength(s, i, ch) {
    let n = 0;
    while (s[i + n] === ch) n++;
    return n;
  }

  /* The index of the backtick run of exactly `n` that closes a code span
   * opened before `from`, or -1. */
  function codeClose(s, from, n) {
    for (let j = s.indexOf("`", from); j >= 0; j = s.indexOf("`", j)) {
      const r = runLength(s, j, "`");
      if (r === n) return j;
      j += r;
    }
    return -1;
  }

  function safeUrl(url) {
    const u = url.trim();
    return SAFE_SCHEME.test(u) && !/[\s<>]/.test(u) ? u : null;
  }

  function unescapeText(s) {
    return s.replace(/\\([!-/:-@[-`{-~])/g, "$1");
  }

  function linkNode(url, title) {
    const a = el("a");
    a.href = url;
    if (title) a.title = title;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    return a;
  }

  /* [label](destination "title") at s[i] == "["; null when it is not one
   * or its destination is not a safe URL. */
  function parseLink(s, i, depth, ctx) {
    let j = i + 1;
    let level = 1;
    for (; j < s.length; j++) {
      const c = s[j];
      if (c === "\\") j++;
      else if (c === "`") {
        const r = runLength(s, j, "`");
        const close = codeClose(s, j + r, r);
        j = close < 0 ? j + r - 1 : close + r - 1;
      } else if (c === "[") level++;
      else if (c === "]" && --level === 0) break;
    }
    if (level || s[j + 1] !== "(") return null;
    let k = j + 2;
    while (s[k] === " " || s[k] === "\n") k++;
    let dest;
    if (s[k] === "<") {
      const end = s.indexOf(">", k);
      if (end < 0 || s.slice(k, end).indexOf("\n") >= 0) return null;
      dest = s.slice(k + 1, end);
      k = end + 1;
    } else {
      const start = k;
      let parens = 0;
      for (; k < s.length && !SPACE.test(s[k]); k++) {
        if (s[k] === "\\") k++;
        else if (s[k] === "(") parens++;
        else if (s[k] === ")") {
          if (!parens) break;
          parens--;
        }
      }
      dest = s.slice(start, k);
    }
    while (s[k] === " " || s[k] === "\n") k++;
    let title = "";
    const q = s[k];
    if (q === '"' || q === "'" || q === "(") {
      const endq = s.indexOf(q === "(" ? ")" : q, k + 1);
      if (endq < 0) return null;
      title = unescapeText(s.slice(k + 1, endq));
      k = endq + 1;
      while (s[k] === " " || s[k] === "\n") k++;
    }
    if (s[k] !== ")") return null;
    const url = safeUrl(unescapeText(dest));
    if (!url) return null;
    const a = linkNode(url, title);
    renderInline(s.slice(i + 1, j), a, depth + 1, { ...ctx, inLink: true });
    return { node: a, end: k + 1 };
  }

  /* A bare http(s) URL at s[i], without the punctuation that ends a sentence. */
  function parseBareUrl(s, i) {
    const m = /^https?:\/\/[^\s<>"'`]+/i.exec(s.slice(i, i + 2048));
    if (!m) return null;
    let url = m[0];
    for (;;) {
      const last = url[url.length - 1];
      if (/[.,;:!?*_~]/.test(last)) url = url.slice(0, -1);
      else if (last === ")" && (url.match(/\(/g) || []).length < (url.match(/\)/g) || []).length) url = url.slice(0, -1);
      else break;
    }
    if (url.length <= "https://".length) return null;
    const a = linkNode(url, "");
    a.textContent = url;
    return { node: a, end: i + url.length };
  }

  /* *em*, **strong**, ***both***, _em_, __strong__, ~~del~~ at s[i]. */
  function parseEmphasis(s, i, depth, ctx) {
    const ch = s[i];
    const run = runLength(s, i, ch);
    if (ch === "~" ? run !== 2 : run > 3) return null;
    const key = ch + run;
    if (ctx.noCloser[key] !== undefined && ctx.noCloser[key] <= i) return null;
    const after = s[i + run];
    if (after === undefined || SPACE.test(after)) return null;
    if (ch === "_" && i > 0 && WORD.test(s[i - 1])) return null;
    for (let j = i + run; j < s.length; ) {
      const c = s[j];
      if (c === "\\") {
        j += 2;
        continue;
      }
      if (c === "`") {
        const r = runLength(s, j, "`");
        const close = codeClose(s, j + r, r);
        j = close < 0 ? j + r : close + r;
        continue;
      }
      if (c === ch) {
        const r = runLength(s, j, ch);
        const before = s[j - 1];
        if (r === run && j > i + run && !SPACE.test(before) && !(ch === "_" && WORD.test(s[j + r] || ""))) {
          let outer, inner;
          if (ch === "~") outer = inner = el("del");
          else if (run === 1) outer = inner = el("em");
          else if (run === 2) outer = inner = el("strong");
          else {
            outer = el("em");
            inner = el("strong");
            outer.appendChild(inner);
          }
          renderInline(s.slice(i + run, j), inner, depth + 1, ctx.inLink ? { inLink: true } : {});
          return { node: outer, end: j + r };
        }
        j += r;
        continue;
      }
      j++;
    }
    /* no closer after i: none after any later opener of this kind either */
    ctx.noCloser[key] = i;
    return null;
  }

  function renderInline(s, parent, depth, ctxIn) {
    const ctx = { inLink: !!(ctxIn && ctxIn.inLink), noCloser: {}, noCodeClose: {} };
    let text = "";
    const flush = () => {
      if (text) parent.appendChild(document.createTextNode(text));
      text = "";
    };
    const put = (node) => {
      flush();
      parent.appendChild(node);
    };
    for (let i = 0; i < s.length; ) {
      const c = s[i];
      if (c === "\\") {
        const n = s[i + 1];
        if (n === "\n") {
          put(el("br"));
          i += 2;
        } else if (n !== undefined && PUNCT.test(n)) {
          text += n;
          i += 2;
        } else {
          text += c;
          i++;
        }
        continue;
      }
      if (c === "`") {
        const r = runLength(s, i, "`");
        const close = ctx.noCodeClose[r] ? -1 : codeClose(s, i + r, r);
        if (close < 0) {
          ctx.noCodeClose[r] = true;
          text += s.substr(i, r);
          i += r;
          continue;
        }
        let code = s.slice(i + r, close).replace(/\n/g, " ");
        if (code.length >= 2 && code[0] === " " && code[code.length - 1] === " " && code.trim()) code = code.slice(1, -1);
        const e = el("code");
        e.textContent = code;
        put(e);
        i = close + r;
        continue;
      }
      if (c === "\n") {
        put(el("br"));
        i++;
        continue;
      }
      let got = null;
      if (depth < MAX_DEPTH) {
        if (c === "*" || c === "_" || c === "~") got = parseEmphasis(s, i, depth, ctx);
        else if (!ctx.inLink && c === "[") got = parseLink(s, i, depth, ctx);
        else if (!ctx.inLink && c === "!" && s[i + 1] === "[") got = parseLink(s, i + 1, depth, ctx);
        else if (!ctx.inLink && c === "<") {
          const m = /^<([a-zA-Z][a-zA-Z0-9+.-]{1,31}:[^<>\s]*)>/.exec(s.slice(i, i + 2048));
          const url = m && safeUrl(m[1]);
          if (url) {
            const a = linkNode(url, "");
            a.textContent = url;
            got = { node: a, end: i + m[0].length };
          }
        } else if (!ctx.inLink && (c === "h" || c === "H") && (i === 0 || !WORD.test(s[i - 1])))
          got = parseBareUrl(s, i);
      }
      if (got) {
        put(got.node);
        i = got.end;
        continue;
      }
      /* a run of delimiters that opened nothing stays text as a whole, so
       * that its tail cannot open a span its head could not */
      const r = c === "*" || c === "_" || c === "~" ? runLength(s, i, c) : 1;
      text += s.substr(i, r);
      i += r;
    }
    flush();
  }

  /* ---- copy ---- */

  function copyText(text, button) {
    const done = (ok) => {
      button.textContent = ok ? "Copied" : "Copy failed";
      setTimeout(() => (button.textContent = "Copy"), 1500);
    };
    if (navigator.clipboard && global.isSecureContext) {
      navigator.clipboard.writeText(text).then(() => done(true), () => done(fallbackCopy(text)));
    } else done(fallbackCopy(text));
  }

  /* Pages served over plain http from another host have no clipboard API. */
  function fallbackCopy(text) {
    const ta = el("textarea", "offscreen");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (e) {
      ok = false;
    }
    ta.remove();
    return ok;
  }

  /* Renders Markdown `text` (any string) into a new DocumentFragment. */
  function render(text) {
    const frag = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n").map(expandTabs);
    renderBlocks(lines, frag, 0, false);
    return frag;
  }

  global.AugurMarkdown = { render };
})(window);
