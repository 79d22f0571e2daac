// llenvs-async view: vanilla JS, no build step. Data comes embedded (--html) or from the server.
"use strict";
(function () {
  const PAGE = 50;
  const MAX_TOKENS_SHOWN = 4000;
  const timings = (window.__viewerTimings = {});
  const t0 = performance.now();

  function embedded(id) {
    const text = document.getElementById(id).textContent;
    return text === "null" ? null : text;
  }
  const embeddedDoc = embedded("viewer-document");
  const embeddedDetails = embedded("viewer-details");
  let detailsCache = null; // parsed on the first trajectory opened, not at load

  function getDocument() {
    if (embeddedDoc !== null) return Promise.resolve(JSON.parse(embeddedDoc));
    return fetch("api/document").then((r) => r.json());
  }
  function getTrajectory(id) {
    if (embeddedDetails !== null) {
      if (detailsCache === null) {
        const started = performance.now();
        detailsCache = JSON.parse(embeddedDetails);
        timings.details_parse_ms = performance.now() - started;
      }
      return Promise.resolve(detailsCache[id] || null);
    }
    return fetch("api/trajectory/" + id).then((r) => (r.ok ? r.json() : null));
  }

  // -- tiny DOM helpers ---------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  function show(...children) {
    app.replaceChildren(h("div", { class: "view" }, ...children));
  }
  const fmt = (x, d = 3) => (x === null || x === undefined ? "-" : Number(x).toFixed(d));
  const pct = (x) => (x === null ? "-" : Math.round(100 * x) + "%");
  const short = (task) => (typeof task === "string" ? task.split("/").pop() : String(task));

  let doc = null;
  const estimatesById = new Map();
  const app = document.getElementById("app");
  const state = { task: "", success: "all", error: "all", page: 0, taskPage: 0 };

  // -- run list -----------------------------------------------------------------------
  function filtered() {
    return doc.runs.filter(
      (r) =>
        (state.task === "" || String(r.task) === state.task || short(r.task) === state.task) &&
        (state.success === "all" || (state.success === "success") === r.success) &&
        (state.error === "all" || (state.error === "error") === (r.error !== null))
    );
  }

  function taskSummary(runs) {
    const groups = new Map();
    for (const r of runs) {
      const key = doc.files[r.file].path + "\u0000" + String(r.task);
      if (!groups.has(key)) groups.set(key, { file: r.file, task: r.task, runs: [] });
      groups.get(key).runs.push(r);
    }
    return [...groups.values()];
  }

  function stats(runs) {
    const n = runs.length;
    const ok = runs.filter((r) => r.success).length;
    const returns = runs.map((r) => r.return).filter((x) => x !== null);
    const mean = returns.length ? returns.reduce((a, b) => a + b, 0) / returns.length : null;
    const errors = runs.filter((r) => r.error !== null).length;
    return { n, success: n ? ok / n : null, mean, errors };
  }

  function pager(id, page, pages, go) {
    return h(
      "div",
      { class: "pager", id },
      h("button", { class: "prev", disabled: page <= 0, onclick: () => go(page - 1) }, "\u2190 prev"),
      h("span", { class: "pager-info" }, `page ${page + 1} of ${Math.max(pages, 1)}`),
      h("button", { class: "next", disabled: page >= pages - 1, onclick: () => go(page + 1) }, "next \u2192")
    );
  }

  function renderRuns() {
    const started = performance.now();
    const runs = filtered();
    const groups = taskSummary(runs);
    const taskPages = Math.ceil(groups.length / PAGE);
    state.taskPage = Math.min(state.taskPage, Math.max(taskPages - 1, 0));
    const total = stats(runs);
    const summary = h(
      "table",
      { id: "task-summary" },
      h("thead", {}, h("tr", {}, ["file", "task", "rollouts", "success", "mean return", "errors"].map((c) => h("th", {}, c)))),
      h(
        "tbody",
        {},
        groups.slice(state.taskPage * PAGE, (state.taskPage + 1) * PAGE).map((g) => {
          const s = stats(g.runs);
          return h(
            "tr",
            { class: "task-row", "data-task": String(g.task), onclick: () => setFilter("task", String(g.task)) },
            h("td", {}, doc.files[g.file].path),
            h("td", { class: "task" }, short(g.task)),
            h("td", { class: "num rollouts" }, s.n),
            h("td", { class: "num success" }, pct(s.success)),
            h("td", { class: "num mean" }, fmt(s.mean, 2)),
            h("td", { class: "num errors" + (s.errors ? " bad" : "") }, s.errors)
          );
        })
      ),
      h(
        "tfoot",
        {},
        h(
          "tr",
          { id: "total-row" },
          h("td", {}, "total"),
          h("td", {}, `${groups.length} tasks`),
          h("td", { class: "num rollouts" }, total.n),
          h("td", { class: "num success" }, pct(total.success)),
          h("td", { class: "num mean" }, fmt(total.mean, 2)),
          h("td", { class: "num errors" }, total.errors)
        )
      )
    );
    const pages = Math.ceil(runs.length / PAGE);
    state.page = Math.min(state.page, Math.max(pages - 1, 0));
    const rows = runs.slice(state.page * PAGE, (state.page + 1) * PAGE);
    const list = h(
      "table",
      { id: "run-table" },
      h("thead", {}, h("tr", {}, ["#", "task", "rollout", "steps", "return", "success", "stop", "error"].map((c) => h("th", {}, c)))),
      h(
        "tbody",
        {},
        rows.map((r) =>
          h(
            "tr",
            { class: "run-row" + (r.error ? " failed" : ""), "data-id": r.id, onclick: () => (location.hash = "#/t/" + r.id) },
            h("td", {}, h("a", { href: "#/t/" + r.id }, r.id)),
            h("td", {}, short(r.task)),
            h("td", { class: "num" }, r.rollout),
            h("td", { class: "num" }, r.steps),
            h("td", { class: "num" }, fmt(r.return, 2)),
            h("td", { class: r.success ? "ok" : "bad" }, r.success ? "\u2713" : "\u2717"),
            h("td", {}, r.stop),
            h("td", { class: "bad" }, r.error ? `${r.error.type} (${r.error.phase})` : "")
          )
        )
      )
    );
    const select = (key, options) =>
      h(
        "select",
        { id: "filter-" + key, onchange: (e) => setFilter(key, e.target.value) },
        options.map(([v, label]) => h("option", { value: v, selected: state[key] === v }, label))
      );
    show(
      h("h2", {}, "Runs"),
      doc.runs.length === 0 ? h("p", { class: "muted" }, "No results file loaded.") : null,
      h(
        "div",
        { class: "filters" },
        h("label", {}, "task ", h("input", { id: "filter-task", value: state.task, placeholder: "all", onchange: (e) => setFilter("task", e.target.value.trim()) })),
        h("label", {}, "success ", select("success", [["all", "all"], ["success", "succeeded"], ["failure", "not succeeded"]])),
        h("label", {}, "error ", select("error", [["all", "all"], ["error", "with error"], ["ok", "without error"]])),
        h("span", { id: "match-count" }, `${runs.length} of ${doc.runs.length} trajectories`)
      ),
      h("h3", {}, "By task"),
      summary,
      pager("task-pager", state.taskPage, taskPages, (p) => ((state.taskPage = p), renderRuns())),
      h("h3", {}, "Trajectories"),
      list,
      pager("run-pager", state.page, pages, (p) => ((state.page = p), renderRuns()))
    );
    timings.runs_render_ms = performance.now() - started;
  }

  function setFilter(key, value) {
    state[key] = value;
    state.page = 0;
    state.taskPage = 0;
    renderRuns();
  }

  // -- trajectory page ----------------------------------------------------------------
  function message(role, cls, body, ...meta) {
    return h("div", { class: "msg " + cls }, h("div", { class: "role" }, role, ...meta), h("pre", {}, body));
  }

  function renderTrajectory(t) {
    if (!t) {
      show(h("p", { class: "bad" }, "No such trajectory."));
      return;
    }
    const tokens = t.steps.reduce((a, s) => a + (s.completion ? s.completion.tokens : 0), 0);
    const last = t.steps.filter((s) => s.completion).pop();
    const facts = [
      ["file", doc.files[t.file].path],
      ["task", String(t.task)],
      ["rollout", t.estimate ? `${t.sample} behind its estimate (record ${t.rollout} of the file)` : t.rollout],
      ["episode", t.episode_id],
      ["steps", t.steps.length],
      ["return", fmt(t.return, 3)],
      ["success", t.success ? "yes" : "no"],
      ["stop reason", t.stop],
      ["completion tokens", tokens],
      ["prompt tokens (last turn)", last ? last.completion.prompt_tokens : "-"],
      ["timing", h("span", { id: "traj-timing" }, trajectoryTiming(t))],
    ];
    const of = t.estimate ? estimatesById.get(t.estimate) : null;
    if (t.estimate) facts.splice(4, 0, ["rollout of", h("a", { id: "traj-estimate", href: "#/values" }, of ? of.label : `estimate ${t.estimate} (not loaded)`)]);
    if (t.start_step > 0) facts.splice(4, 0, ["started at", `step ${t.start_step}, after ${t.prefix.join(" \u2192 ")}`]);
    const messages = [];
    if (t.system_prompt) messages.push(message("system", "msg-system", t.system_prompt));
    messages.push(message("observation", "msg-observation", t.initial));
    for (const s of t.steps) {
      const c = s.completion;
      if (c && c.reasoning) messages.push(h("details", { class: "reasoning" }, h("summary", {}, `reasoning ${s.step}`), h("pre", {}, c.reasoning)));
      messages.push(
        message(
          `action ${s.step}`,
          "msg-action",
          s.action + (s.tool_calls && s.tool_calls.length ? "\n" + JSON.stringify(s.tool_calls, null, 1) : ""),
          h("span", { class: "reward" + (s.reward > 0 ? " ok" : "") }, `reward ${fmt(s.reward, 2)}`),
          c ? h("span", { class: "meta" }, `${c.tokens} tokens \u00b7 prompt ${c.prompt_tokens} \u00b7 ${c.finish_reason || "-"}`) : null,
          Object.keys(s.timing).length ? h("span", { class: "meta step-timing" }, timingParts(s.timing).join(" \u00b7 ")) : null,
          s.terminated ? h("span", { class: "meta" }, "terminated") : null,
          s.truncated ? h("span", { class: "meta" }, "truncated") : null,
          s.parse_error ? h("span", { class: "meta bad parse-error" }, `format error: ${s.parse_error}`) : null
        )
      );
      messages.push(message(`observation ${s.step + 1}`, "msg-observation", s.observation));
    }
    show(
      h("p", {}, t.estimate ? h("a", { href: "#/values" }, "\u2190 value tree") : h("a", { href: "#/runs" }, "\u2190 runs")),
      h("h2", { id: "traj-title", "data-id": t.id, class: t.error ? "bad" : "" }, `Trajectory ${t.id}: task ${short(t.task)}, rollout ${t.estimate ? t.sample : t.rollout}`, t.error ? " (failed)" : ""),
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      t.error
        ? h(
            "div",
            { class: "error-box", id: "traj-error" },
            h("strong", {}, `${t.error.type} in phase ${t.error.phase}`),
            h("pre", {}, t.error.message),
            t.error.traceback ? h("details", {}, h("summary", {}, "traceback"), h("pre", {}, t.error.traceback)) : null
          )
        : null,
      h("h3", {}, "Messages"),
      h("div", { id: "messages" }, messages),
      t.tokens ? tokenView(t.tokens) : null,
      Object.keys(t.info || {}).length ? [h("h3", {}, "Info"), h("pre", {}, JSON.stringify(t.info, null, 1))] : null
    );
  }

  // seconds are *_sec (runner: generate_sec/step_sec per step, wall_sec; env: duration_sec)
  const TIME_LABELS = { started_at: "started", wall_sec: "wall", generate_sec: "generate", step_sec: "env step", duration_sec: "command", replay_sec: "restore (replay)" };
  const timeLabel = (k) => TIME_LABELS[k] || k.replace(/_sec$/, "");
  function timingParts(timing) {
    return Object.entries(timing).map(([k, v]) => `${timeLabel(k)} ${k.endsWith("_sec") ? fmt(v) + " s" : v}`);
  }
  function trajectoryTiming(t) {
    const sums = {};
    for (const s of t.steps) for (const [k, v] of Object.entries(s.timing)) sums[k] = (sums[k] || 0) + (v || 0);
    const parts = [...timingParts(t.timing), ...timingParts(sums).map((x) => "\u03a3 " + x)];
    return parts.length ? parts.join(" \u00b7 ") : "not recorded";
  }

  function tokenView(tok) {
    const n = tok.input_ids.length;
    const shown = Math.min(n, MAX_TOKENS_SHOWN);
    const strip = h("div", { id: "loss-mask", class: "tokens" });
    const frag = document.createDocumentFragment();
    for (let i = 0; i < shown; i++) {
      const m = tok.loss_mask[i];
      frag.append(h("span", { class: m ? "tok m1" : "tok m0", title: `#${i} id ${tok.input_ids[i]} mask ${m}` }, tok.input_ids[i]));
    }
    strip.append(frag);
    return [
      h("h3", {}, "Tokens (token mode)"),
      h(
        "p",
        { id: "token-summary" },
        `${n} tokens: prompt ${tok.prompt_length}, sampled ${tok.sampled} (loss mask 1, highlighted), ${tok.turns.length} turns`,
        shown < n ? ` \u2014 first ${shown} shown` : ""
      ),
      strip,
    ];
  }

  // -- value tree ---------------------------------------------------------------------
  function bounds(node) {
    const ests = [node.v, ...node.q].filter(Boolean);
    for (const e of ests) {
      const r = e.reward_range;
      if (r && r[0] !== null && r[1] !== null) return [r[0], r[1], true];
    }
    const xs = ests.flatMap((e) => [e.ci_low, e.ci_high, ...e.returns]).filter((x) => x !== null);
    const lo = Math.min(...xs, 0);
    const hi = Math.max(...xs, lo + 1);
    return [lo, hi, false];
  }

  function bar(e, lo, hi) {
    const pos = (x) => (100 * (Math.min(Math.max(x, lo), hi) - lo)) / (hi - lo);
    const track = h("div", { class: "bar-track", title: `[${fmt(e.ci_low)}, ${fmt(e.ci_high)}] in [${lo}, ${hi}]` });
    if (e.ci_low !== null && e.ci_high !== null) {
      const left = pos(e.ci_low);
      track.append(h("div", { class: "bar-ci", style: `left:${left}%;width:${Math.max(pos(e.ci_high) - left, 0.5)}%` }));
    }
    if (e.mean !== null) track.append(h("div", { class: "bar-mean", style: `left:${pos(e.mean)}%` }));
    return track;
  }

  function estimateRow(label, cls, e, lo, hi, through, child) {
    const failedChips = Array.from({ length: e.failed }, () => h("span", { class: "ret failed-rollout" }, "failed"));
    const chips = e.returns.map((x) => h("span", { class: "ret", style: `--v:${(x - lo) / (hi - lo)}` }, fmt(x, 2)));
    return h(
      "div",
      { class: "estimate " + cls + (e.failed ? " has-failed" : "") + (e.n === 0 ? " no-data" : ""), "data-id": e.id },
      h(
        "div",
        { class: "est-line" },
        h("span", { class: "est-label" }, label),
        bar(e, lo, hi),
        h("span", { class: "est-mean" }, fmt(e.mean)),
        h("span", { class: "est-ci" }, `[${fmt(e.ci_low)}, ${fmt(e.ci_high)}]`),
        h("span", { class: "est-n" }, `n=${e.n}` + (e.failed ? ` \u00b7 ${e.failed} failed` : "")),
        h("span", { class: "muted" }, e.method)
      ),
      h(
        "details",
        { class: "rollouts" },
        h("summary", {}, `rollouts: ${e.returns.length} returns` + (e.failed ? `, ${e.failed} failed` : "") + (e.rollouts ? ` \u00b7 ${e.rollouts.length} trajectories` : "")),
        h("div", { class: "returns" }, chips, failedChips),
        rolloutList(e),
        through.length
          ? h("div", { class: "through" }, "in the loaded runs: ", through.map((x) => h("a", { href: "#/t/" + x.id, class: "traj-link" }, `#${x.id}`)))
          : null
      ),
      child
    );
  }

  function rolloutList(e) {
    if (!e.rollouts) {
      return e.trajectories ? h("p", { class: "muted not-loaded" }, `trajectories in ${e.trajectories} (not loaded: add it to the view command)`) : null;
    }
    return h(
      "table",
      { class: "rollout-list" },
      e.rollouts.map((r) =>
        h(
          "tr",
          { class: "rollout-row" + (r.error ? " failed" : ""), "data-id": r.id, onclick: () => (location.hash = "#/t/" + r.id) },
          h("td", {}, h("a", { class: "rollout-link", href: "#/t/" + r.id }, `rollout ${r.sample}`)),
          h("td", { class: "num" }, r.error ? "-" : fmt(r.return, 2)),
          h("td", { class: "num" }, `${r.steps} step${r.steps === 1 ? "" : "s"}`),
          h("td", {}, r.stop),
          h("td", { class: "bad" }, r.error ? `failed: ${r.error.type} (${r.error.phase})` : "")
        )
      )
    );
  }

  function renderValues() {
    if (doc.values.length === 0) {
      show(h("h2", {}, "Value tree"), h("p", { class: "muted" }, "No q-values --json file loaded."));
      return;
    }
    const key = (n) => JSON.stringify(n.task);
    const byTask = new Map();
    for (const n of doc.values) {
      if (!byTask.has(key(n))) byTask.set(key(n), []);
      byTask.get(key(n)).push(n);
    }
    const isPrefix = (a, b) => a.length < b.length && a.every((x, i) => x === b[i]);
    const trees = [];
    for (const nodes of byTask.values()) {
      nodes.sort((a, b) => a.prefix.length - b.prefix.length);
      const children = new Map(nodes.map((n) => [n, []]));
      const roots = [];
      for (const n of nodes) {
        const parent = nodes.filter((p) => isPrefix(p.prefix, n.prefix)).pop();
        (parent ? children.get(parent) : roots).push(n);
      }
      trees.push(h("section", { class: "task-tree" }, h("h3", {}, `task ${short(nodes[0].task)}`), roots.map((r) => stateNode(r, children))));
    }
    show(
      h("h2", {}, "Value tree"),
      h("p", { class: "muted" }, "V(s) and Q(s, a) with 95% intervals over the reward range; open a row for the rollouts behind it."),
      trees
    );
  }

  function stateNode(n, children) {
    const [lo, hi, declared] = bounds(n);
    const kids = children.get(n);
    const under = (action) => kids.filter((k) => k.prefix[n.step] === action);
    const placed = new Set();
    const qRows = n.q.map((e) => {
      const sub = under(e.action);
      sub.forEach((k) => placed.add(k));
      const through = n.through.filter((x) => x.action === e.action);
      return estimateRow(`Q(s, ${e.action})`, "q", e, lo, hi, through, sub.length ? h("div", { class: "children" }, sub.map((k) => stateNode(k, children))) : null);
    });
    const rest = kids.filter((k) => !placed.has(k));
    const path = ["s0", ...n.prefix.map((a, i) => `\u2014${a}\u2192 s${i + 1}`)].join(" ");
    return h(
      "div",
      { class: "state-node", "data-step": n.step },
      h("div", { class: "state-head" }, h("strong", {}, `state at step ${n.step}`), h("code", {}, path), h("span", { class: "muted" }, `range [${lo}, ${hi}]${declared ? "" : " (from the data)"} \u00b7 ${doc.files[n.file].path}`)),
      n.v ? estimateRow("V(s)", "v", n.v, lo, hi, n.through, null) : null,
      qRows,
      rest.length ? h("div", { class: "children" }, rest.map((k) => stateNode(k, children))) : null
    );
  }

  // -- routing ------------------------------------------------------------------------
  function route() {
    const hash = location.hash || (doc.runs.length ? "#/runs" : "#/values");
    document.getElementById("nav-runs").classList.toggle("active", hash.startsWith("#/runs"));
    document.getElementById("nav-values").classList.toggle("active", hash.startsWith("#/values"));
    const m = hash.match(/^#\/t\/(\d+)$/);
    if (m) getTrajectory(Number(m[1])).then(renderTrajectory);
    else if (hash.startsWith("#/values")) renderValues();
    else renderRuns();
    window.scrollTo(0, 0);
  }

  getDocument()
    .then((d) => {
      doc = d;
      timings.parse_ms = performance.now() - t0;
      for (const n of d.values) {
        const at = `task ${short(n.task)}, step ${n.step}`;
        if (n.v && n.v.id) estimatesById.set(n.v.id, { label: `V(s) at ${at}` });
        for (const q of n.q) if (q.id) estimatesById.set(q.id, { label: `Q(s, ${q.action}) at ${at}` });
      }
      const what = { run: "records", values: "estimates", rollouts: "rollouts", atif: "ATIF trajectories" };
      document.getElementById("files").textContent = d.files.map((f) => `${f.path} (${f.records} ${what[f.kind]}` + (f.unmatched ? `, ${f.unmatched} of no loaded estimate` : "") + ")").join(" \u00b7 ");
      window.addEventListener("hashchange", route);
      route();
      timings.ready_ms = performance.now() - t0;
      document.body.setAttribute("data-ready", "1");
    })
    .catch((err) => {
      show(h("p", { class: "bad" }, "Could not load the data: " + err));
    });
})();
