// beamflow status page: keeps the runs list and a run's page current by polling the JSON API.
// No framework and no HTML parsing of data: every value goes in through textContent or an
// attribute, so scan names and error messages can never become markup.
(() => {
  "use strict";

  const body = document.body;
  const page = body.dataset.page;
  const pollMs = Math.max(0.5, parseFloat(body.dataset.poll || "2")) * 1000;
  const iconsUrl = body.dataset.icons || "/static/icons.svg";
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : "";
  const SVG = "http://www.w3.org/2000/svg";

  const LABEL = {
    QUEUED: "Queued", ACTIVE: "Running", INACTIVE: "Waiting",
    SUCCEEDED: "Succeeded", FAILED: "Failed", CANCELLED: "Cancelled",
  };
  const ICON = {
    QUEUED: "queued", ACTIVE: "active", INACTIVE: "inactive",
    SUCCEEDED: "ok", FAILED: "failed", CANCELLED: "cancelled",
  };

  // -- small DOM helpers ------------------------------------------------------------------
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function icon(name, cls) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", cls || "icon");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    const use = document.createElementNS(SVG, "use");
    use.setAttribute("href", iconsUrl + "#" + name);
    svg.appendChild(use);
    return svg;
  }

  function badge(status) {
    const b = el("span", "badge s-" + status);
    b.dataset.status = status;
    b.appendChild(icon(ICON[status] || "queued"));
    b.appendChild(el("span", "badge-text", LABEL[status] || status));
    return b;
  }

  function pad(n) { return String(n).padStart(2, "0"); }

  function localTime(value) {
    if (value === null || value === undefined || value === "") return "–";
    const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
    if (isNaN(d.getTime())) return "–";
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function setProgress(prog, run) {
    // A <progress> with a value is determinate; without one the browser animates it.
    if (run.progress !== null && run.progress !== undefined) {
      prog.max = 1;
      prog.value = run.progress;
      prog.hidden = false;
    } else if (run.status === "ACTIVE") {
      prog.removeAttribute("value");
      prog.hidden = false;
    } else {
      prog.hidden = true;
    }
  }

  function localizeTimes(root) {
    root.querySelectorAll("time[data-t]").forEach((t) => {
      const v = parseFloat(t.dataset.t);
      if (!isNaN(v)) t.textContent = localTime(v);
    });
  }

  // -- live indicator and the polling loop -----------------------------------------------------
  const live = document.getElementById("live");
  const liveText = document.getElementById("live-text");

  function setLive(ok, detail) {
    if (!live) return;
    live.classList.toggle("down", !ok);
    // Announce a lost connection to screen readers, not every refresh.
    live.setAttribute("role", ok ? "presentation" : "alert");
    liveText.textContent = ok ? "Live · " + localTime(Date.now() / 1000).slice(11) : detail;
  }

  function loop(refresh, slowWhen) {
    let timer = null;
    let failures = 0;
    async function tick() {
      clearTimeout(timer);
      try {
        await refresh();
        failures = 0;
        setLive(true);
      } catch (err) {
        failures += 1;
        setLive(false, "Connection lost — retrying");
      }
      let wait = pollMs * Math.min(8, 1 + failures);
      if (document.hidden || (slowWhen && slowWhen())) wait = Math.max(wait, pollMs * 5);
      timer = setTimeout(tick, wait);
    }
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) tick();
    });
    timer = setTimeout(tick, pollMs);
    return tick;
  }

  async function getJSON(url) {
    const res = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (res.status === 401) {
      location.href = "/login?next=" + encodeURIComponent(location.pathname);
      throw new Error("login needed");
    }
    if (!res.ok) throw new Error(url + ": HTTP " + res.status);
    return res.json();
  }

  // -- runs page -------------------------------------------------------------------------------
  function runsPage() {
    const tbody = document.getElementById("runs-body");
    const empty = document.getElementById("runs-empty");
    const range = document.getElementById("range");
    const pager = range.parentElement;
    const form = document.getElementById("filters");
    const fStatus = document.getElementById("f-status");
    const fScan = document.getElementById("f-scan");
    const fSince = document.getElementById("f-since");
    const fSort = document.getElementById("f-sort");
    const params = new URLSearchParams(location.search);
    const state = {
      status: (params.get("status") || "").toUpperCase(),
      scan: params.get("scan") || "",
      since: params.get("since") || "",
      sort: params.get("sort") || "newest",
      limit: parseInt(params.get("limit") || "50", 10) || 50,
      offset: parseInt(params.get("offset") || "0", 10) || 0,
    };

    function query(offset) {
      const q = new URLSearchParams();
      if (state.status) q.set("status", state.status);
      if (state.scan) q.set("scan", state.scan);
      if (state.since) q.set("since", state.since);
      if (state.sort && state.sort !== "newest") q.set("sort", state.sort);
      if (state.limit !== 50) q.set("limit", String(state.limit));
      if (offset) q.set("offset", String(offset));
      return q.toString();
    }

    // Each cell carries its column's name: on a phone-width screen the rows are cards and
    // the names label the facts (status.css).
    function cell(cls, label, text) {
      const td = el("td", cls, text);
      td.dataset.label = label;
      return td;
    }

    function fillRow(tr, r, x) {
      x = x || {};
      tr.className = "run s-" + r.status;
      tr.dataset.id = r.id;
      tr.replaceChildren();

      const cStatus = cell("c-status", "Status");
      cStatus.appendChild(badge(r.status));
      if (r.verdict === "suspect") {
        const v = el("span", "verdict suspect", "suspect");
        v.title = (r.verdict_reasons || []).join(" ");
        cStatus.appendChild(v);
      }

      const cScan = cell("c-scan", "Scan");
      const a = el("a", "scan", r.display_name || r.scan_name);
      a.href = r.url;
      cScan.appendChild(a);
      cScan.appendChild(el("div", "path", r.scan_path || ""));
      const sub = [];
      if (r.fraction && r.fraction < 1) sub.push(Math.round(r.fraction * 100) + "% of frames");
      if (r.attempt > 1) sub.push("attempt " + r.attempt);
      cScan.appendChild(el("div", "sub", sub.join(" · ")));
      const err = r.error ? (x.error_step_text ? x.error_step_text + ": " : "") + r.error : "";
      cScan.appendChild(el("div", "err", err));

      const cStep = cell("c-step", "Step", x.step_text || "–");

      const cProg = cell("c-progress", "Progress");
      if (r.progress !== null || r.status === "ACTIVE") {
        const prog = el("progress");
        setProgress(prog, r);
        cProg.appendChild(prog);
      }
      cProg.appendChild(el("span", "ptext", r.progress_text));
      cProg.appendChild(el("span", "rate", x.rate_text || ""));

      const cBackend = cell("c-backend", "Backend", r.backend);
      const cStarted = cell("c-started", "Started");
      cStarted.appendChild(el("time", null, localTime(r.started_at || r.created_at)));
      const cDur = cell("c-duration", "Duration", r.duration_text);

      tr.append(cStatus, cScan, cStep, cProg, cBackend, cStarted, cDur);
    }

    function render(data) {
      const existing = new Map();
      tbody.querySelectorAll("tr[data-id]").forEach((tr) => existing.set(tr.dataset.id, tr));
      const rows = data.runs.map((r) => {
        const x = (data.extras || {})[r.id];
        const sig = JSON.stringify([r, x]);
        let tr = existing.get(r.id);
        if (!tr) tr = el("tr");
        if (tr.dataset.sig !== sig) {
          fillRow(tr, r, x);
          tr.dataset.sig = sig;
        }
        return tr;
      });
      // Reorder only when the order changed, so rows that did not change are left alone.
      const current = Array.from(tbody.children);
      if (current.length !== rows.length || rows.some((tr, i) => current[i] !== tr)) {
        tbody.replaceChildren(...rows);
      }
      empty.hidden = rows.length > 0;

      let all = 0;
      for (const [status, n] of Object.entries(data.counts)) {
        all += n;
        const b = document.querySelector('[data-count="' + status + '"]');
        if (b) b.textContent = String(n);
      }
      const allB = document.querySelector('[data-count="ALL"]');
      if (allB) allB.textContent = String(all);
      document.querySelectorAll(".chip[data-filter]").forEach((chip) => {
        chip.classList.toggle("on", chip.dataset.filter === state.status);
      });

      range.textContent = data.total
        ? (data.offset + 1) + "–" + (data.offset + data.runs.length) + " of " + data.total
        : "0 runs";
      pager.querySelectorAll("a").forEach((link) => link.remove());
      if (data.offset > 0) {
        const newer = el("a", null, "← Newer");
        newer.href = "/?" + query(Math.max(0, data.offset - data.limit));
        newer.rel = "prev";
        pager.appendChild(newer);
      }
      if (data.offset + data.limit < data.total) {
        const older = el("a", null, "Older →");
        older.href = "/?" + query(data.offset + data.limit);
        older.rel = "next";
        pager.appendChild(older);
      }
    }

    function agentList(list, items) {
      list.replaceChildren(...items.map((item) => {
        const li = el("li");
        if (item.wait) li.dataset.wait = item.wait;
        li.append(el("span", "name", item.name), el("span", "why", item.reason),
          el("code", "path", item.path));
        return li;
      }));
    }

    function renderAgent(a) {
      const panel = document.getElementById("agent");
      if (!panel) return;
      panel.dataset.state = a.state;
      document.getElementById("agent-headline").textContent = a.headline;
      document.getElementById("agent-waiting-box").hidden = a.waiting.length === 0;
      document.getElementById("agent-waiting-count").textContent = String(a.waiting_total);
      agentList(document.getElementById("agent-waiting"), a.waiting);
      document.getElementById("agent-skipped-box").hidden = a.skipped.length === 0;
      document.getElementById("agent-skipped-count").textContent = String(a.skipped_total);
      agentList(document.getElementById("agent-skipped"), a.skipped);
      document.getElementById("agent-idle").hidden =
        !a.available || a.waiting.length > 0 || a.skipped.length > 0;
    }

    let inflight = 0;
    async function refresh() {
      const mine = ++inflight;
      const [data, agent] = await Promise.all([
        getJSON("/api/runs?" + query(state.offset)), getJSON("/api/agent")]);
      if (mine === inflight) render(data); // a newer request (filter change) wins
      renderAgent(agent);
    }

    const tick = loop(refresh);

    function applyFilters() {
      state.status = fStatus.value;
      state.scan = fScan.value.trim();
      state.since = fSince ? fSince.value : "";
      state.sort = fSort ? fSort.value : "newest";
      state.offset = 0;
      const q = query(0);
      history.replaceState(null, "", q ? "/?" + q : "/");
      tick();
    }

    let debounce = null;
    fScan.addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(applyFilters, 250);
    });
    fStatus.addEventListener("change", applyFilters);
    if (fSince) fSince.addEventListener("change", applyFilters);
    if (fSort) fSort.addEventListener("change", applyFilters);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      applyFilters();
    });
    document.querySelectorAll(".chip[data-filter]").forEach((chip) => {
      chip.addEventListener("click", (ev) => {
        ev.preventDefault();
        fStatus.value = chip.dataset.filter;
        applyFilters();
      });
    });
  }

  // -- one run -----------------------------------------------------------------------------
  function runPage() {
    const root = document.getElementById("run");
    const runId = root.dataset.id;
    let finished = false;

    function placeBars(scope) {
      scope.querySelectorAll(".fill[data-left]").forEach((fill) => {
        fill.style.left = fill.dataset.left + "%";
        fill.style.width = fill.dataset.width + "%";
      });
    }

    function renderSteps(steps) {
      const list = document.getElementById("steps");
      list.replaceChildren(...steps.map((s) => {
        const li = el("li", "step st-" + s.icon);
        const row = el("div", "step-row");
        const name = el("span", "step-name", s.label || s.name);
        name.title = s.name;
        row.append(icon(s.icon), name,
          el("span", "step-status", s.status.toLowerCase()), el("span", "step-dur", s.duration_text));
        const bar = el("div", s.indeterminate ? "bar indeterminate" : "bar");
        bar.setAttribute("aria-hidden", "true");
        const fill = el("span", "fill");
        fill.dataset.left = s.left;
        fill.dataset.width = s.width;
        bar.appendChild(fill);
        li.append(row, bar);
        return li;
      }));
      placeBars(list);
      document.getElementById("steps-empty").hidden = steps.length > 0;
    }

    function previewKey(p) { return p.kind === "other" ? "i" + p.index : p.kind; }

    function figure(p, scan) {
      const fig = el("figure", "preview k-" + p.kind);
      fig.dataset.key = previewKey(p);
      fig.dataset.kind = p.kind;
      fig.dataset.index = p.index;
      fillFigure(fig, p, scan);
      return fig;
    }

    function fillFigure(fig, p, scan) {
      fig.dataset.index = p.index;
      let img = fig.querySelector("img");
      if (p.exists && p.is_image) {
        if (!img) {
          fig.replaceChildren();
          const a = el("a");
          a.target = "_blank";
          a.rel = "noopener";
          a.title = "Open full size";
          img = el("img");
          img.alt = p.label + " of " + scan;
          img.src = p.url;
          a.appendChild(img);
          a.href = p.url;
          fig.appendChild(a);
        } else if (img.getAttribute("src") !== p.url) {
          // Load the new version first, then swap: no blank frame while it downloads.
          const next = new Image();
          next.onload = () => {
            img.src = p.url;
            img.parentElement.href = p.url;
          };
          next.src = p.url;
        }
      } else if (!fig.querySelector(".missing")) {
        fig.replaceChildren(el("div", "missing", p.exists ? "not an image" : "file not available yet"));
      }
      let cap = fig.querySelector("figcaption");
      if (!cap) {
        cap = el("figcaption");
        fig.appendChild(cap);
      } else {
        fig.appendChild(cap); // keep the caption last
      }
      cap.replaceChildren(document.createTextNode(p.label + " "), el("span", "muted", p.name));
      if (p.full_range_url) {
        const full = el("a", "full-range", "full range");
        full.href = p.full_range_url;
        full.target = "_blank";
        full.rel = "noopener";
        cap.append(" ", full);
      }
    }

    function renderPreviews(previews, scan) {
      const box = document.getElementById("previews");
      const have = new Map();
      box.querySelectorAll("figure.preview").forEach((fig) => {
        if (!fig.dataset.key) {
          fig.dataset.key = fig.dataset.kind === "other" ? "i" + fig.dataset.index : fig.dataset.kind;
        }
        have.set(fig.dataset.key, fig);
      });
      const figs = previews.map((p) => {
        const fig = have.get(previewKey(p));
        if (fig) {
          fillFigure(fig, p, scan);
          return fig;
        }
        return figure(p, scan);
      });
      const current = Array.from(box.children);
      if (current.length !== figs.length || figs.some((f, i) => current[i] !== f)) {
        box.replaceChildren(...figs);
      }
      document.getElementById("previews-empty").hidden = previews.length > 0;
    }

    function renderEvents(events) {
      const list = document.getElementById("events");
      list.replaceChildren(...events.map((e) => {
        const li = el("li", "ev lv-" + e.level);
        li.append(el("time", null, localTime(e.time)), el("span", "lv", e.level), el("span", "msg", e.message));
        return li;
      }));
      document.getElementById("events-empty").hidden = events.length > 0;
    }

    function renderAttempts(attempts) {
      document.getElementById("attempts-panel").hidden = attempts.length < 2;
      document.getElementById("attempts").replaceChildren(...attempts.map((a) => {
        const li = el("li", "attempt s-" + a.status);
        const head = el("div", "attempt-head");
        const status = el("span", "attempt-status");
        status.append(icon(ICON[a.status] || "queued"), a.status_label);
        head.append(el("b", null, "Attempt " + a.attempt), status,
          el("span", "attempt-dur", a.duration_text));
        const times = el("div", "attempt-times");
        times.append(el("time", null, localTime(a.started_at)), " → ",
          el("time", null, localTime(a.finished_at)));
        li.append(head, times);
        if (a.error) {
          const why = el("p", "attempt-error");
          if (a.error_step_text) why.append(el("span", "attempt-step", "in " + a.error_step_text), " ");
          if (a.error_kind) why.append(el("span", "kind", a.error_kind), " ");
          why.append(el("span", "attempt-msg", a.error));
          li.appendChild(why);
        }
        return li;
      }));
    }

    function render(d) {
      const r = d.run;
      finished = r.finished;
      document.title = (r.display_name || r.scan_name) + " · " + r.status_label + " · beamflow";
      const holder = document.getElementById("run-badge");
      const old = holder.querySelector(".badge");
      if (!old || old.dataset.status !== r.status) holder.replaceChildren(badge(r.status));

      setProgress(document.getElementById("run-progress"), r);
      document.getElementById("run-progress-row").className = "progress-row s-" + r.status;
      root.querySelectorAll("[data-field]").forEach((node) => {
        const key = node.dataset.field;
        if (key === "started_text") node.textContent = localTime(r.started_at || r.created_at);
        else node.textContent = r[key] || "–";
      });
      root.querySelectorAll("[data-extra]").forEach((node) => {
        node.textContent = (d.extras || {})[node.dataset.extra] || "–";
      });
      document.querySelectorAll('.kv [data-field="finished_text"]').forEach((node) => {
        node.textContent = localTime(r.finished_at);
      });

      const errBox = document.getElementById("run-error");
      errBox.hidden = !r.error;
      errBox.className = "callout " + (r.status === "FAILED" ? "error" : "note");
      document.getElementById("run-error-icon").replaceChildren(icon(ICON[r.status] || "failed"));
      document.getElementById("run-error-title").textContent =
        r.status === "FAILED" ? "Failed" : r.status === "CANCELLED" ? "Cancelled" : "Note";
      const errStep = (d.extras || {}).error_step_text;
      document.getElementById("run-error-step").textContent = errStep ? " in step " + errStep : "";
      document.getElementById("run-error-text").textContent = r.error || "";

      const retryForm = document.getElementById("retry-form");
      if (retryForm) retryForm.hidden = !d.can_retry || !!r.retry_refusal;
      const retryNote = document.getElementById("run-retry-note");
      if (retryNote) {
        retryNote.hidden = !(r.finished && r.retry_refusal && r.status !== "SUCCEEDED");
        if (r.retried_by) {
          const link = el("a", "", r.retried_by.slice(0, 8));
          link.href = "/runs/" + r.retried_by;
          retryNote.replaceChildren("Retried as run ", link, ".");
        } else {
          retryNote.textContent = "A retry would not help: the input is at fault. " +
            "Fix the scan or the parameters and start a new run.";
        }
      }

      const product = document.getElementById("product");
      if (d.product_url) {
        const path = product.querySelector("code.path");
        if (!path || path.textContent !== r.product) {
          const a = el("a", null, r.product.split(/[\\/]/).pop());
          a.href = d.product_url;
          a.setAttribute("download", "");
          product.replaceChildren(a, el("code", "path", r.product));
        }
      }
      const truth = document.getElementById("truth");
      if (truth) {
        const known = r.truth_nrmse !== null && r.truth_nrmse !== undefined;
        document.querySelectorAll(".kv .truth").forEach((node) => { node.hidden = !known; });
        if (known) {
          truth.replaceChildren(el("b", null, "NRMSE " + r.truth_nrmse.toFixed(3)), " ",
            el("span", "muted", "complex, against the simulator's ground truth"));
        }
      }
      renderSteps(d.steps);
      renderPreviews(d.previews, r.display_name || r.scan_name);
      renderEvents(d.events);
      renderAttempts(d.attempts);
    }

    placeBars(document);
    loop(async () => render(await getJSON("/api/runs/" + encodeURIComponent(runId))), () => finished);
    finished = !!document.querySelector("#run-badge .s-SUCCEEDED, #run-badge .s-FAILED, #run-badge .s-CANCELLED");

    const retryForm = document.getElementById("retry-form");
    const retryBtn = document.getElementById("retry");
    if (retryForm && retryBtn) {
      retryForm.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const msg = document.getElementById("retry-msg");
        retryBtn.disabled = true;
        msg.hidden = true;
        try {
          const res = await fetch(retryForm.action, {
            method: "POST",
            headers: { "X-CSRF-Token": csrf, Accept: "application/json" },
            credentials: "same-origin",
          });
          const data = await res.json().catch(() => ({}));
          if (!res.ok) throw new Error(data.detail || "HTTP " + res.status);
          location.href = data.url;
        } catch (err) {
          msg.textContent = "Retry failed: " + err.message;
          msg.hidden = false;
          retryBtn.disabled = false;
        }
      });
    }
  }

  localizeTimes(document);
  if (page === "runs") runsPage();
  else if (page === "run") runPage();
})();
