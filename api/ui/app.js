// effect-ledger web audit page: plain JavaScript, no dependencies, no build.
//
// Every value read from the ledger goes into the page as text (through
// el() and text nodes, never as HTML): receipts hold strings written by
// gateways and models. The page's Content-Security-Policy enforces Trusted
// Types, so an HTML sink would throw instead of parsing.
'use strict';

(() => {
  const TOKEN_KEY = 'effect-ledger.token';
  const NS_KEY = 'effect-ledger.namespace';
  // The page is served at <base>ui/ and the API at <base>v1/, so that the
  // page also works behind a reverse proxy that mounts ledgerd on a prefix.
  const BASE = location.pathname.replace(/ui\/[^/]*$/, '');

  // Audit members (SPEC §5) in display order, with what they mean. A member
  // the server adds later is shown too, after these, under its own name.
  const AUDIT_MEMBERS = {
    runtime_retries: {
      title: 'Runtime retries',
      desc: 'The same execution reserved a key again with the next attempt: the runtime retried.',
    },
    re_invocations: {
      title: 'Re-invocations',
      desc: 'A new execution of the same call: deduplicated replays, and takeovers or retries by another execution.',
    },
    duplicate_effects: {
      title: 'Duplicate effects',
      desc: 'Distinct keys ran the same tool on the same input and all succeeded: the "refund called twice" a key cannot catch.',
      attention: true,
    },
    repeated_failures: {
      title: 'Repeated failures',
      desc: 'The same failing step run again: a call (tool and input) failed under one key, then was reserved again, unchanged, under other keys.',
      attention: true,
    },
    interrupted: {
      title: 'Interrupted keys',
      desc: "Lease ended without an outcome: the effect may or may not have happened. Non-idempotent keys await a person (on the key's timeline, or ledgerctl resolve).",
      attention: true,
    },
    failed: {
      title: 'Failed keys',
      desc: 'Keys whose latest outcome is a failure, with its error code.',
      attention: true,
    },
    resolutions: {
      title: 'Operator resolutions',
      desc: 'Decisions recorded by a person about interrupted keys.',
    },
    renewed_keys: {
      title: 'Renewed keys',
      desc: "A key's outcome had expired (the namespace's key lifetime) and a later reserve started a new generation of it: a new effect under the same key, not a re-invocation.",
    },
    not_applied_reruns: {
      title: 'Not-applied reruns',
      desc: 'A key whose outcome claimed to apply nothing (not_applied) was reserved and run again. A false claim shows here.',
    },
  };

  const COLUMN_LABELS = {
    execution_id: 'execution',
    first_execution_id: 'first execution',
    input_hash: 'input',
    error_code: 'error',
    error_codes: 'between attempts',
    reserve_seq: 'reserve',
    lease_expires_at: 'lease ended',
    recorded_at: 'recorded',
    awaiting_person: 'awaiting a person',
    previous_final_seq: 'previous outcome',
    not_applied_seq: 'not applied at',
  };

  const $ = (id) => document.getElementById(id);

  // el creates an element. Attributes are set as DOM properties from a
  // fixed list; children that are not nodes become text nodes.
  const PROPS = new Set(['id', 'title', 'type', 'value', 'colSpan', 'hidden', 'disabled', 'name', 'open']);
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'href') e.setAttribute('href', v);
      else if (k === 'data') Object.assign(e.dataset, v);
      else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
      else if (PROPS.has(k)) e[k] = v;
      else throw new Error('el: unsupported attribute ' + k);
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  // ---- formatting ----

  function fmtTime(ms, zone = ' UTC') {
    if (!ms) return '—';
    const d = new Date(ms);
    if (Number.isNaN(d.getTime())) return String(ms);
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, zone);
  }

  function timeEl(ms, zone) {
    return el('span', { class: 'num', title: ms ? new Date(ms).toISOString() : undefined }, fmtTime(ms, zone));
  }

  function ago(ms) {
    const s = Math.round((Date.now() - ms) / 1000);
    if (s < 0) return 'in ' + human(-s);
    return human(s) + ' ago';
  }

  function human(s) {
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.round(s / 60) + ' min';
    if (s < 86400) return (s / 3600).toFixed(1).replace(/\.0$/, '') + ' h';
    return (s / 86400).toFixed(1).replace(/\.0$/, '') + ' d';
  }

  function fmtDuration(ms) {
    if (ms < 1000) return ms + ' ms';
    return human(Math.round(ms / 1000));
  }

  function short(h, n = 12) {
    return h && h.length > n + 1 ? h.slice(0, n) + '…' : h;
  }

  function hashEl(h, n = 12) {
    if (!h) return el('span', { class: 'muted' }, '—');
    return el('span', { class: 'mono', title: h }, short(h, n));
  }

  function keyLink(key, cls = 'clip') {
    return el('a', { class: 'mono ' + cls, href: '#key/' + encodeURIComponent(key), title: key, data: { key: key } }, key);
  }

  // clip shows a long value on one line, cut with an ellipsis; the whole
  // value is in its tooltip (and in the receipt's detail).
  function clip(text, cls = '') {
    return el('span', { class: 'mono clip ' + cls, title: text }, text);
  }

  function badge(text, cls) {
    return el('span', { class: 'badge ' + (cls || '') }, text);
  }

  function kv(pairs) {
    const dl = el('dl', { class: 'kv' });
    for (const [k, v] of pairs) {
      if (v === undefined || v === null || v === '') continue;
      dl.append(el('dt', null, k), el('dd', null, v));
    }
    return dl;
  }

  function plural(n, word) {
    return n + ' ' + word + (n === 1 ? '' : 's');
  }

  function yesNo(b) {
    return b ? 'yes' : 'no';
  }

  function jsonText(v) {
    return JSON.stringify(v, null, 2);
  }

  // resultCell shows a receipt's result from result_text, the stored text
  // that is hashed (contract v1.4 §9.1), indented with every number as
  // written (JSON.parse would round 9007199254740993); a receipt without
  // result_text shows its parsed result.
  function resultCell(r) {
    if (typeof r.result_text === 'string') {
      if (r.result_text === '') return '';
      let text = r.result_text;
      if (!r.result_encoding) {
        try {
          text = indentJSON(text);
        } catch (e) {
          // not JSON: shown as it is
        }
      }
      return el('pre', null, text);
    }
    return r.result === null || r.result === undefined ? '' : el('pre', null, jsonText(r.result));
  }

  // indentJSON shows compact JSON text as JSON.stringify(v, null, 2)
  // would show its value, but with every number as written.
  function indentJSON(s) {
    let out = '', depth = 0;
    const nl = () => '\n' + '  '.repeat(depth);
    for (let i = 0; i < s.length; i++) {
      const c = s[i];
      if (c === '"') {
        let j = i + 1;
        for (; s[j] !== '"'; j++) if (s[j] === '\\') j++;
        out += JSON.stringify(JSON.parse(s.slice(i, j + 1)));
        i = j;
      } else if (c === '{' || c === '[') {
        const close = c === '{' ? '}' : ']';
        if (s[i + 1] === close) {
          out += c + close;
          i++;
        } else {
          depth++;
          out += c + nl();
        }
      } else if (c === '}' || c === ']') {
        depth--;
        out += nl() + c;
      } else if (c === ',') {
        out += ',' + nl();
      } else if (c === ':') {
        out += ': ';
      } else {
        out += c;
      }
    }
    return out;
  }

  function empty(text) {
    return el('div', { class: 'empty' }, text);
  }

  // ---- API ----

  class APIError extends Error {
    constructor(status, code, message, details) {
      super(message);
      this.status = status;
      this.code = code;
      this.details = details || {};
    }
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  }

  // namespace is the namespace the page shows (SPEC §7: each namespace is
  // a chain of its own); the choice is kept in this tab.
  function namespace() {
    return sessionStorage.getItem(NS_KEY) || 'default';
  }

  // nsPath turns an API path of the default namespace into the selected
  // namespace's form: /v1/… under /v1/ns/{ns}/…, the log under /log/{ns}/.
  // The routes that are not about one namespace stay as they are.
  function nsPath(path) {
    const ns = namespace();
    if (ns === 'default') return path;
    if (path.startsWith('log/default/')) return 'log/' + encodeURIComponent(ns) + '/' + path.slice('log/default/'.length);
    if (path.startsWith('v1/') && !/^v1\/(verification|namespaces|openapi\.json)(\?|\/|$)/.test(path)) {
      return 'v1/ns/' + encodeURIComponent(ns) + '/' + path.slice('v1/'.length);
    }
    return path;
  }

  let authSeen = null; // whether the server asked for a token

  // request fetches path from the API with the token and returns the
  // response; error responses throw an APIError with the contract's code.
  // body, when given, is sent as JSON with POST.
  async function request(path, okStatuses = [200], body = undefined) {
    const headers = { Accept: 'application/json' };
    const t = token();
    if (t) headers.Authorization = 'Bearer ' + t;
    const init = { headers, cache: 'no-store', credentials: 'omit', redirect: 'error' };
    if (body !== undefined) {
      init.method = 'POST';
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(BASE + nsPath(path), init);
    } catch (e) {
      throw new APIError(0, 'network', 'ledgerd cannot be reached (' + e.message + ')');
    }
    if (okStatuses.includes(res.status)) {
      if (authSeen === null) authSeen = Boolean(t);
      return res;
    }
    let code = 'http_' + res.status;
    let message = res.statusText || 'request failed';
    let details = {};
    try {
      const body = await res.json();
      if (body && body.error) {
        code = String(body.error.code);
        message = String(body.error.message);
        details = body.error.details || {};
      }
    } catch (e) {
      // not the contract's error shape: keep the status
    }
    throw new APIError(res.status, code, message, details);
  }

  async function api(path) {
    return (await request(path)).json();
  }

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
    const s = q.toString();
    return s ? '?' + s : '';
  }

  // ---- session ----

  function showLogin(err) {
    authSeen = true;
    const msg = $('login-message');
    msg.className = 'muted';
    if (err.status === 403) {
      const role = err.details.role ? ' (' + err.details.role + ')' : '';
      msg.textContent = 'This token' + role + ' may not read the ledger: use a reader, approver or admin token.';
      msg.className = 'login-error';
    } else if (token()) {
      msg.textContent = 'The server refused this token: ' + err.message + '.';
      msg.className = 'login-error';
    } else {
      msg.textContent = 'This ledger requires a bearer token with the reader, approver or admin role.';
    }
    $('main').hidden = true;
    $('login').hidden = false;
    $('banner').hidden = true;
    updateSession();
    $('token').focus();
  }

  function hideLogin() {
    $('login').hidden = true;
    $('main').hidden = false;
  }

  function updateSession() {
    const has = Boolean(token());
    $('forget').hidden = !has;
    $('session-state').textContent = has ? 'token in use' : authSeen === false ? 'open ledger (no tokens)' : '';
  }

  // prunedBy says where a 410 pruned went (contract §16): the prune
  // receipt that pruned it and the segment that holds its body.
  function prunedBy(err) {
    const d = err.details || {};
    return 'pruned by #' + d.prune + (d.segment ? ' (segment ' + d.segment + ')' : '');
  }

  function showError(err) {
    if (err.status === 401 || err.status === 403) {
      showLogin(err);
      return;
    }
    const b = $('banner');
    if (err.code === 'pruned') {
      b.replaceChildren(el('strong', null, 'pruned'), ': ' + (err.details && err.details.seq ? 'receipt #' + err.details.seq + ' was ' : '') + prunedBy(err) + '.');
      b.hidden = false;
      return;
    }
    b.replaceChildren(el('strong', null, err.code || 'error'), ': ', err.message || String(err));
    if (err.status === 429 || err.status === 503) b.append(' Try again in a moment.');
    b.hidden = false;
  }

  // ---- namespaces ----

  // loadNamespaces fills the namespace selector from GET /v1/namespaces
  // (a token limited to namespaces lists only those). It is shown when
  // there is more than the default namespace to choose from; a selection
  // the list no longer has falls back to default (or the first listed).
  async function loadNamespaces() {
    let list = null;
    try {
      list = (await api('v1/namespaces')).namespaces;
    } catch (err) {
      if (err.status === 401) throw err;
      // 403 (a role that may not list them) or 404 (a ledger without
      // namespaces): the default namespace only.
    }
    const picker = $('ns-picker');
    if (!Array.isArray(list) || list.length === 0) {
      sessionStorage.removeItem(NS_KEY);
      picker.hidden = true;
      return;
    }
    const names = list.map((n) => String(n.name));
    if (!names.includes(namespace())) {
      const pick = names.includes('default') ? 'default' : names[0];
      if (pick === 'default') sessionStorage.removeItem(NS_KEY);
      else sessionStorage.setItem(NS_KEY, pick);
    }
    const sel = $('namespace');
    const pruned = (n) => (n.pruned_through > 0 ? ', 1–' + n.pruned_through + ' pruned' : '');
    sel.replaceChildren(...list.map((n) => el('option', { value: String(n.name) }, String(n.name) + ' (' + plural(n.head.seq, 'receipt') + pruned(n) + ')')));
    sel.value = namespace();
    picker.hidden = names.length === 1 && names[0] === 'default';
  }

  // ---- routing ----

  let generation = 0; // drops answers to views the user has left

  function parseHash() {
    const h = location.hash.replace(/^#/, '');
    const qi = h.indexOf('?');
    const path = qi < 0 ? h : h.slice(0, qi);
    const params = new URLSearchParams(qi < 0 ? '' : h.slice(qi + 1));
    const slash = path.indexOf('/');
    const view = (slash < 0 ? path : path.slice(0, slash)) || 'overview';
    let arg = slash < 0 ? '' : path.slice(slash + 1);
    try {
      arg = decodeURIComponent(arg);
    } catch (e) {
      // a malformed escape: use it as typed
    }
    return { view, arg, params };
  }

  const VIEWS = { overview: renderOverview, receipts: renderReceipts, key: renderKey, audit: renderAudit, approvals: renderApprovals };

  async function route() {
    const my = ++generation;
    const live = () => my === generation;
    let { view, arg, params } = parseHash();
    if (!VIEWS[view]) view = 'overview';
    for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('active', a.dataset.view === view);
    for (const name of Object.keys(VIEWS)) $('view-' + name).hidden = name !== view;
    $('banner').hidden = true;
    hideLogin();
    try {
      await loadNamespaces();
      if (!live()) return;
      await VIEWS[view](live, arg, params);
    } catch (err) {
      if (live()) showError(err);
    }
    if (live()) updateSession();
  }

  // ---- overview ----

  const RECENT = 8; // receipts on the overview

  async function renderOverview(live) {
    const head = await api('v1/head');
    if (!live()) return;
    $('head-seq').textContent = head.seq.toLocaleString('en-US');
    $('head-hash').replaceChildren(el('span', { class: 'hash', title: 'hash of receipt ' + head.seq }, head.hash));
    $('head-pruned').hidden = !head.pruned;
    $('head-pruned').textContent = head.pruned ? 'pruned through #' + head.pruned.through + ' by #' + head.pruned.prune + ': their hashes kept, their bodies in the archive' : '';
    $('checkpoint').replaceChildren(empty('Loading…'));
    $('verification').replaceChildren(empty('Loading…'));
    $('audit-tiles').replaceChildren(empty('Running the audit…'));
    $('audit-warning').replaceChildren();
    const settle = async (p, render, target) => {
      try {
        const v = await p;
        if (live()) render(v);
      } catch (err) {
        if (!live()) return;
        if (err.status === 401 || err.status === 403) throw err;
        target.replaceChildren(el('div', { class: 'login-error' }, 'Could not load: ', err.code, ': ', err.message));
      }
    };
    $('recent').replaceChildren(empty('Loading…'));
    await Promise.all([
      settle(api('v1/receipts' + query({ after: Math.max(0, head.seq - RECENT), limit: RECENT })),
        (page) => $('recent').replaceChildren(page.receipts.length ? receiptTable(page.receipts.reverse(), 'recent-table') : empty('The ledger is empty.')), $('recent')),
      settle(Promise.all([loadCheckpoint(), loadSigningKeys()]), ([cp, keys]) => renderCheckpoint(cp, head, keys), $('checkpoint')),
      settle(api('v1/verification'), renderVerification, $('verification')),
      settle(loadAudit({}), renderAuditTiles, $('audit-tiles')),
    ]);
  }

  async function loadCheckpoint() {
    try {
      const res = await request('log/default/checkpoint');
      return await res.text();
    } catch (err) {
      if (err.status === 404) return null;
      throw err;
    }
  }

  // The namespace's key history (SPEC §9.2); null where it cannot be read.
  async function loadSigningKeys() {
    try {
      return await api('v1/signing-keys');
    } catch (err) {
      if (err.status === 401) throw err;
      return null;
    }
  }

  // keyRows shows which keys signed the latest checkpoint and the
  // namespace's rotations, newest first.
  function keyRows(keys) {
    if (!keys) return [];
    const signed = keys.checkpoint_keys.length ? keys.checkpoint_keys.map((id) => el('span', { class: 'mono' }, id + ' ')) : '—';
    const rows = [kv([['signed by key', el('span', { id: 'checkpoint-keys' }, signed)]])];
    if (keys.rotations.length) {
      const tbody = el('tbody', null, keys.rotations.slice().reverse().map((r) => el('tr', null,
        el('td', { class: 'num' }, String(r.seq)), el('td', null, timeEl(r.recorded_at)),
        el('td', { class: 'mono' }, r.key_id), el('td', { class: 'mono' }, r.retires), el('td', null, r.actor))));
      rows.push(el('details', { id: 'key-rotations' }, el('summary', { class: 'small' }, plural(keys.rotations.length, 'key rotation')),
        el('div', { class: 'table-wrap' }, el('table', null,
          el('thead', null, el('tr', null, ['seq', 'recorded (UTC)', 'new key', 'retired key', 'actor'].map((c) => el('th', null, c)))), tbody))));
    }
    return rows;
  }

  function renderCheckpoint(text, head, keys) {
    const box = $('checkpoint');
    if (text === null) {
      box.replaceChildren(
        el('div', { class: 'status-line' }, badge('none', ''), el('strong', null, 'No signed checkpoints')),
        el('p', { class: 'muted small' }, 'This server publishes no signed checkpoint at /log/' + namespace() + '/checkpoint. Pin the head instead: ledgerctl verify --expect-head SEQ:HASH.'),
      );
      return;
    }
    const lines = text.split('\n');
    const size = Number(lines[1]);
    const covers = Number.isFinite(size) ? size.toLocaleString('en-US') + ' of ' + head.seq.toLocaleString('en-US') + ' receipts' : '';
    box.replaceChildren(
      el('div', { class: 'status-line' }, badge('signed', 'ok'), el('strong', null, covers)),
      kv([['origin', el('span', { class: 'mono' }, lines[0] || '')], ['root', el('span', { class: 'mono', title: lines[2] || '' }, short(lines[2] || '', 24))]]),
      ...keyRows(keys),
      el('details', null, el('summary', { class: 'small' }, 'Signed note'), el('pre', null, text)),
    );
  }

  function renderVerification(v) {
    const box = $('verification');
    const vcard = $('card-violations');
    vcard.hidden = true;
    if (!v.enabled) {
      box.replaceChildren(
        el('div', { class: 'status-line' }, badge('off', ''), el('strong', null, 'Periodic verification is off')),
        el('p', { class: 'muted small' }, 'Start ledgerd with --verify-every 10m to verify the chain in the background, or run ledgerctl verify.'),
      );
      return;
    }
    if (!v.ran) {
      box.replaceChildren(
        el('div', { class: 'status-line' }, badge('pending', 'info'), el('strong', null, 'The first run has not finished yet')),
        el('p', { class: 'muted small' }, 'Runs every ' + fmtDuration(v.every_ms) + '.'),
      );
      return;
    }
    let status;
    if (v.error) status = [badge('error', 'bad'), el('strong', null, v.error)];
    else if (v.ok) status = [badge('intact', 'ok'), el('strong', null, 'No violations')];
    else status = [badge(plural(v.violations_total, 'violation'), 'bad'), el('strong', null, 'The chain is not intact')];
    box.replaceChildren(
      el('div', { class: 'status-line', id: 'verification-status' }, status),
      kv([
        ['finished', el('span', null, timeEl(v.finished_at), ' ', el('span', { class: 'muted' }, '(' + ago(v.finished_at) + ')'))],
        ['run', (v.incremental ? 'incremental' : 'full') + ' in ' + fmtDuration(v.duration_ms) + ', every ' + fmtDuration(v.every_ms)],
        ['receipts', v.error ? '' : v.receipts.toLocaleString('en-US') + ' (' + v.checked.toLocaleString('en-US') + (v.incremental ? ' new' : '') + ' rehashed)'],
        ['head', v.error ? '' : el('span', null, String(v.head.seq), ' · ', hashEl(v.head.hash))],
        ['last success', v.last_success_at ? el('span', null, timeEl(v.last_success_at)) : 'never'],
      ]),
    );
    if (!v.ok && !v.error) {
      vcard.hidden = false;
      const rows = v.violations.map((x) => el('tr', null, el('td', { class: 'num' }, String(x.seq)), el('td', null, badge(x.rule, 'bad')), el('td', null, x.detail)));
      $('violations').replaceChildren(
        el('div', { class: 'table-wrap' }, el('table', { id: 'violations-table' }, el('thead', null, el('tr', null, el('th', null, 'seq'), el('th', null, 'rule'), el('th', null, 'detail'))), el('tbody', null, rows))),
        el('p', { class: 'muted small', hidden: v.violations_total <= v.violations.length }, 'and ' + (v.violations_total - v.violations.length) + ' more: run ledgerctl verify for the full list.'),
      );
    }
  }

  async function loadAudit(params) {
    const res = await request('v1/audit' + query(params));
    const violations = Number(res.headers.get('Ledger-Violations') || '0');
    return { audit: await res.json(), violations };
  }

  function auditMembers(audit) {
    const names = Object.keys(AUDIT_MEMBERS).filter((n) => n in audit);
    for (const n of Object.keys(audit)) if (!(n in AUDIT_MEMBERS)) names.push(n);
    return names;
  }

  function memberTitle(name) {
    const m = AUDIT_MEMBERS[name];
    if (m) return m.title;
    const s = name.replace(/_/g, ' ');
    return s.charAt(0).toUpperCase() + s.slice(1);
  }

  function violationWarning(n) {
    if (!n) return null;
    return el('div', { class: 'banner', id: 'audit-violations' },
      el('strong', null, 'The chain has ' + plural(n, 'integrity violation') + '.'),
      ' This audit is not to be trusted until they are explained: run ledgerctl verify.');
  }

  function renderAuditTiles({ audit, violations }) {
    $('audit-warning').replaceChildren(violationWarning(violations) || '');
    $('audit-tiles').replaceChildren(...auditMembers(audit).map((name) => {
      const list = Array.isArray(audit[name]) ? audit[name] : [];
      const attention = list.length > 0 && AUDIT_MEMBERS[name] && AUDIT_MEMBERS[name].attention;
      const awaiting = list.filter((x) => x && x.awaiting_person === true).length;
      return el('a', { class: 'tile' + (attention ? ' attention' : ''), href: '#audit/' + encodeURIComponent(name), data: { member: name } },
        el('div', { class: 'n' }, String(list.length)),
        el('div', { class: 't' }, memberTitle(name)),
        awaiting ? el('div', { class: 'sub' }, awaiting + ' awaiting a person') : null);
    }));
  }

  // ---- receipts ----

  const RECEIPT_FILTERS = ['key', 'execution_id', 'tool', 'kind', 'after', 'limit'];

  async function renderReceipts(live, _arg, params) {
    const form = $('receipts-form');
    for (const f of RECEIPT_FILTERS) form.elements[f].value = params.get(f) || (f === 'limit' ? '50' : '');
    const filters = {};
    for (const f of RECEIPT_FILTERS) filters[f] = params.get(f) || '';
    if (!filters.limit) filters.limit = '50';
    $('receipts').replaceChildren(empty('Loading…'));
    const page = await api('v1/receipts' + query(filters));
    if (!live()) return;
    const rs = page.receipts;
    const filtered = ['key', 'execution_id', 'tool', 'kind'].some((f) => filters[f]);
    $('receipts-title').textContent = rs.length
      ? (filtered ? 'Matching receipts' : 'Receipts') + ' · seq ' + rs[0].seq + '–' + rs[rs.length - 1].seq
      : 'Receipts';
    const next = $('page-next');
    next.disabled = page.next_after === null;
    next.dataset.after = page.next_after === null ? '' : String(page.next_after);
    $('page-first').disabled = !filters.after;
    if (!rs.length) {
      $('receipts').replaceChildren(empty(filtered || filters.after ? 'No receipt matches.' : 'The ledger is empty.'));
      return;
    }
    $('receipts').replaceChildren(receiptTable(rs, 'receipts-table'));
  }

  const RECEIPT_COLUMNS = ['seq', 'recorded (UTC)', 'kind', 'key', 'execution', 'attempt', 'tool', 'outcome', 'error', 'ref', 'actor', 'hash'];

  // receiptTable lists receipts; a click on a row shows all its fields.
  function receiptTable(rs, id) {
    const tbody = el('tbody');
    for (const r of rs) {
      const row = el('tr', { class: 'row', data: { seq: String(r.seq) } },
        el('td', { class: 'num' }, String(r.seq)),
        el('td', { class: 'nowrap' }, timeEl(r.recorded_at, '')),
        el('td', null, badge(r.kind, kindClass(r))),
        el('td', null, keyLink(r.idempotency_key)),
        el('td', null, clip(r.execution_id)),
        el('td', { class: 'num' }, String(r.attempt)),
        el('td', null, clip(r.tool)),
        el('td', null, r.outcome ? badge(r.outcome, r.outcome) : ''),
        el('td', null, clip(r.error_code)),
        el('td', { class: 'num' }, r.ref_seq ? String(r.ref_seq) : ''),
        el('td', null, clip(r.actor)),
        el('td', { class: 'nowrap' }, hashEl(r.hash, 8)));
      row.addEventListener('click', (ev) => {
        if (ev.target.closest('a')) return;
        const next = row.nextElementSibling;
        if (next && next.classList.contains('detail')) next.remove();
        else row.after(el('tr', { class: 'detail' }, el('td', { colSpan: RECEIPT_COLUMNS.length }, receiptDetail(r))));
      });
      tbody.append(row);
    }
    return el('div', { class: 'table-wrap' }, el('table', { id },
      el('thead', null, el('tr', null, RECEIPT_COLUMNS.map((c) => el('th', null, c)))), tbody));
  }

  function kindClass(r) {
    if (r.kind === 'commit' || r.kind === 'resolve' || r.kind === 'reconcile') return r.outcome;
    if (r.kind === 'replay') return 'ok';
    return 'info';
  }

  // payload shows a payload field of r (contract §14): what shown makes of
  // its value, or, once erased, which erase receipt took it.
  function payload(r, field, shown) {
    if (r.erased && r.erased[field]) {
      return el('span', { class: 'erased' }, 'erased by receipt ' + r.erased[field]);
    }
    return shown;
  }

  function receiptDetail(r) {
    return kv([
      ['seq', String(r.seq)],
      ['kind', r.kind],
      ['idempotency key', el('span', { class: 'mono' }, r.idempotency_key)],
      ['key generated', yesNo(r.key_generated)],
      ['execution', el('span', { class: 'mono' }, r.execution_id)],
      ['attempt', String(r.attempt)],
      ['tool', el('span', { class: 'mono' }, r.tool)],
      ['effect', r.effect],
      ['idempotent', yesNo(r.idempotent)],
      ['input hash', r.input_hash ? el('span', { class: 'mono' }, r.input_hash) : ''],
      ['outcome', r.outcome],
      ['external ref', payload(r, 'external_ref', r.external_ref ? el('span', { class: 'mono' }, r.external_ref) : '')],
      ['result', payload(r, 'result', resultCell(r))],
      ['error code', r.error_code],
      ['error message', payload(r, 'error_message', r.error_message)],
      ['retryable', r.kind === 'commit' || r.kind === 'resolve' || r.kind === 'reconcile' ? (r.outcome === 'failed' ? yesNo(r.retryable) : '') : ''],
      ['lease expires', r.lease_expires_at ? timeEl(r.lease_expires_at) : ''],
      ['ref seq', r.ref_seq ? String(r.ref_seq) : ''],
      ['actor', r.actor],
      ['note', payload(r, 'note', r.note)],
      ['recorded', timeEl(r.recorded_at)],
      ['prev hash', el('span', { class: 'hash' }, r.prev_hash)],
      ['hash', el('span', { class: 'hash' }, r.hash)],
    ]);
  }

  // ---- key timeline ----

  async function renderKey(live, key) {
    $('key-form').elements.key.value = key;
    $('resolve-card').hidden = true;
    const box = $('key-view');
    if (!key) {
      box.replaceChildren(el('div', { class: 'card' }, empty('Enter an idempotency key, or click a key anywhere on this page.')));
      return;
    }
    box.replaceChildren(el('div', { class: 'card' }, empty('Loading…')));
    let v;
    try {
      v = await api('v1/effects/' + encodeURIComponent(key));
    } catch (err) {
      if (err.code !== 'unknown_key' && err.code !== 'invalid_key' && err.code !== 'pruned') throw err;
      const why = err.code === 'unknown_key' ? 'No receipt has this key.' : err.code === 'pruned' ? 'Its receipts were ' + prunedBy(err) + '.' : err.message;
      if (live()) box.replaceChildren(el('div', { class: 'card' }, el('div', { class: 'key-name' }, key), el('div', { class: 'empty', id: err.code === 'pruned' ? 'key-pruned' : null }, why)));
      return;
    }
    if (!live()) return;
    const rs = v.receipts;
    const bySeq = new Map(rs.map((r) => [r.seq, r]));
    const firstExec = rs.length ? rs[0].execution_id : '';
    // The view lists the key's current generation: a first reserve that
    // follows an earlier receipt renewed an expired key.
    const renewedSeq = rs.length && rs[0].kind === 'reserve' && rs[0].ref_seq ? rs[0].seq : 0;
    const events = rs.map((r) => describe(r, bySeq, firstExec, renewedSeq));
    const execs = new Map();
    for (const r of rs) {
      let e = execs.get(r.execution_id);
      if (!e) execs.set(r.execution_id, (e = { id: r.execution_id, attempts: new Set(), kinds: [], first: r.recorded_at }));
      e.attempts.add(r.attempt);
      e.kinds.push(r.kind);
    }
    const reserves = rs.filter((r) => r.kind === 'reserve');
    const retries = events.filter((e) => e.runtimeRetry).length;
    const reinv = events.filter((e) => e.reInvocation).length;
    const replays = rs.filter((r) => r.kind === 'replay').length;

    const summary = el('div', { class: 'card', id: 'key-summary' },
      el('div', { class: 'key-head' }, el('span', { class: 'key-name', id: 'key-name' }, v.idempotency_key), badge(v.state, v.state)),
      kv([
        ['tool', el('span', { class: 'mono' }, v.tool)],
        ['effect', v.effect],
        ['idempotent', v.idempotent ? 'yes: an interrupted lease may be taken over, a retryable failure retried' : 'no: an interrupted lease needs a person'],
        ['fingerprint', v.input_hash ? el('span', { class: 'mono' }, v.input_hash) : el('span', { class: 'muted' }, 'no input hash')],
        ['expires', v.expires_at
          ? el('span', { id: 'key-expires' }, timeEl(v.expires_at), el('span', { class: 'muted' }, ' — a reserve from then on starts a new generation of the key'))
          : ''],
      ]),
      el('div', { class: 'stats' },
        stat(rs.length, 'receipts'), stat(reserves.length, 'attempts reserved'), stat(execs.size, 'executions'),
        stat(retries, 'runtime retries'), stat(reinv, 're-invocations'), stat(replays, 'replays')));

    const execRows = [...execs.values()].map((e) => el('tr', null,
      el('td', { class: 'mono' }, e.id),
      el('td', null, e.id === firstExec ? 'first' : 're-invocation'),
      el('td', { class: 'num' }, [...e.attempts].join(', ')),
      el('td', null, kindCounts(e.kinds)),
      el('td', null, timeEl(e.first))));
    const execCard = el('div', { class: 'card' }, el('h2', null, 'Executions'),
      el('div', { class: 'table-wrap' }, el('table', { id: 'executions-table' },
        el('thead', null, el('tr', null, el('th', null, 'execution'), el('th', null, 'role'), el('th', null, 'attempts'), el('th', null, 'receipts'), el('th', null, 'first seen'))),
        el('tbody', null, execRows))));

    const items = events.map((e) => el('li', { class: 'k-' + e.cls, data: { seq: String(e.r.seq) } },
      el('div', { class: 'ev-title' }, el('span', null, e.title), e.badge || null),
      el('div', { class: 'ev-meta' }, '#' + e.r.seq + ' · ', timeEl(e.r.recorded_at), ' · execution ', el('span', { class: 'mono' }, e.r.execution_id), ' · attempt ' + e.r.attempt, e.r.actor ? ' · by ' : '', e.r.actor ? el('span', { class: 'mono' }, e.r.actor) : null),
      el('div', { class: 'ev-body' }, e.body)));
    const last = reserves[reserves.length - 1];
    if (last && v.state === 'interrupted') {
      items.push(el('li', { class: 'k-retry' },
        el('div', { class: 'ev-title' }, el('span', null, 'Lease ended without an outcome'), badge('interrupted', 'interrupted')),
        el('div', { class: 'ev-meta' }, timeEl(last.lease_expires_at)),
        el('div', { class: 'ev-body' }, v.idempotent
          ? 'The effect may or may not have happened. The next reserve takes it over (the handler is idempotent).'
          : 'The effect may or may not have happened. A person must resolve it: with the form below (an admin token), or ledgerctl resolve KEY --outcome … --note …')));
    } else if (v.state === 'not_applied') {
      items.push(el('li', { class: 'k-reserve' },
        el('div', { class: 'ev-title' }, el('span', null, 'Nothing was applied'), badge('not_applied', 'not_applied')),
        el('div', { class: 'ev-body' }, 'The last outcome claims the effect applied nothing: the next reserve, by any execution, runs it again.')));
    } else if (last && v.state === 'reserved') {
      items.push(el('li', { class: 'k-reserve' },
        el('div', { class: 'ev-title' }, el('span', null, 'In progress'), badge('reserved', 'reserved')),
        el('div', { class: 'ev-meta' }, 'lease ends ', timeEl(last.lease_expires_at))));
    }
    const timeline = el('div', { class: 'card' }, el('h2', null, 'Timeline'), el('ol', { class: 'timeline', id: 'timeline' }, items));
    box.replaceChildren(summary, el('div', { class: 'key-grid' }, execCard, timeline));
    showResolve(v);
  }

  // ---- resolve ----

  // A person's decision about a key (SPEC §4, §4.1): an interrupted key
  // resolved with what happened, or a failed key corrected to not_applied.
  // It needs an admin token; the server decides, the page shows its
  // refusals under the form.
  const RESOLVE_ERRORS = {
    forbidden: 'Resolving needs an admin token: this token may read, not resolve.',
    not_interrupted: 'The key is not interrupted (any more): a call took it over or a person resolved it meanwhile. Refresh to see its state.',
    invalid_request: 'The server refused what the form says: see the message above.',
    unknown_key: 'No receipt has this key in this namespace.',
  };

  function showResolve(v) {
    const card = $('resolve-card');
    const interrupted = v.state === 'interrupted';
    const failed = v.state === 'failed';
    card.hidden = !interrupted && !failed;
    if (card.hidden) return;
    const form = $('resolve-form');
    if (form.dataset.key !== v.idempotency_key) form.reset();
    form.dataset.key = v.idempotency_key;
    $('resolve-title').textContent = interrupted ? 'Resolve this interrupted key' : 'Mark this failure as not applied';
    $('resolve-desc').textContent = interrupted
      ? 'Its lease ended without an outcome: the effect may or may not have happened. Check where it would have happened, then record what did. ' +
        (v.idempotent ? 'The next call of this idempotent tool may also take it over.' : 'Until a person resolves it, the same call is refused (unsafe_resume).')
      : 'Its failure may have left something behind, so the same call is not run again. A person who checked that nothing was applied may say so: the same call then runs again.';
    for (const o of form.elements.outcome.options) o.disabled = failed && o.value !== 'not_applied' && o.value !== '';
    if (failed && form.elements.outcome.value !== 'not_applied') form.elements.outcome.value = '';
    resolveFields();
    $('resolve-submit').disabled = false;
    $('resolve-error').hidden = true;
  }

  // resolveFields shows the fields the chosen outcome takes: an external
  // reference for succeeded and failed, an error for failed and
  // not_applied.
  function resolveFields() {
    const outcome = $('r-outcome').value;
    $('r-ref-field').hidden = outcome !== 'succeeded' && outcome !== 'failed';
    $('r-error-fields').hidden = outcome !== 'failed' && outcome !== 'not_applied';
  }

  // resolveKey posts the form to POST /v1/effects/{key}/resolve, then
  // shows the key again; a refusal stays on screen with the form.
  async function resolveKey() {
    const form = $('resolve-form');
    const key = form.dataset.key;
    if (!key || $('resolve-card').hidden) return;
    const v = formValues(form, ['outcome', 'external_ref', 'error_code', 'error_message', 'note']);
    const body = { outcome: v.outcome, note: v.note };
    if (v.external_ref && !$('r-ref-field').hidden) body.external_ref = v.external_ref;
    if (!$('r-error-fields').hidden && (v.error_code || v.error_message)) {
      body.error = { code: v.error_code };
      if (v.error_message) body.error.message = v.error_message;
    }
    $('resolve-submit').disabled = true;
    $('resolve-error').hidden = true;
    const my = generation;
    try {
      await request('v1/effects/' + encodeURIComponent(key) + '/resolve', [201], body);
    } catch (err) {
      $('resolve-submit').disabled = false;
      if (err.status === 401) {
        showLogin(err);
        return;
      }
      const why = RESOLVE_ERRORS[err.code];
      const field = err.details && err.details.field ? ' (field ' + err.details.field + ')' : '';
      const b = $('resolve-error');
      b.replaceChildren(el('strong', null, err.code || 'error'), ': ', (err.message || String(err)) + field, why ? el('div', { class: 'small' }, why) : null);
      b.hidden = false;
      return;
    }
    form.reset();
    if (my === generation) route();
  }

  // kindCounts summarizes receipt kinds in order of first appearance:
  // "reserve ×2, commit ×2".
  function kindCounts(kinds) {
    const n = new Map();
    for (const k of kinds) n.set(k, (n.get(k) || 0) + 1);
    return [...n].map(([k, c]) => (c > 1 ? k + ' ×' + c : k)).join(', ');
  }

  function stat(n, label) {
    return el('div', { class: 'stat' }, el('div', { class: 'n' }, String(n)), el('div', { class: 't' }, label));
  }

  // describe names what a receipt of a key means in its story.
  function describe(r, bySeq, firstExec, renewedSeq) {
    const ref = bySeq.get(r.ref_seq);
    const sameExec = ref && ref.execution_id === r.execution_id;
    const byNew = r.execution_id !== firstExec;
    const e = { r, cls: r.kind, title: r.kind, body: null, runtimeRetry: false, reInvocation: false };
    const outcome = () => [
      ['external ref', payload(r, 'external_ref', r.external_ref ? el('span', { class: 'mono' }, r.external_ref) : '')],
      ['result', payload(r, 'result', resultCell(r))],
      ['error', r.error_code ? el('span', null, el('span', { class: 'mono' }, r.error_code), r.error_message || (r.erased && r.erased.error_message) ? ' — ' : '',
        payload(r, 'error_message', r.error_message)) : ''],
      ['retryable', r.outcome === 'failed' ? yesNo(r.retryable) : ''],
    ];
    switch (r.kind) {
      case 'reserve':
        if (!r.ref_seq) {
          e.title = 'Reserved';
        } else if (r.seq === renewedSeq) {
          e.title = 'Reserved again after the key expired';
          e.badge = badge('new generation', 'ok');
        } else if (ref && ref.outcome === 'not_applied') {
          e.title = sameExec ? 'Runtime retry after an outcome that applied nothing' : 'Run again after an outcome that applied nothing';
          e.badge = badge('after not_applied ' + ref.error_code, 'info');
        } else if (ref && ref.kind === 'reserve') {
          e.cls = 'takeover';
          e.title = sameExec ? 'Runtime retry: took over the interrupted lease' : 'Re-invocation: took over the interrupted lease';
        } else {
          e.cls = 'retry';
          e.title = sameExec ? 'Runtime retry after a failure' : 'Re-invocation: retry after a failure';
          if (ref && ref.error_code) e.badge = badge('after ' + ref.error_code, 'warn');
        }
        e.runtimeRetry = Boolean(r.ref_seq) && sameExec && r.seq !== renewedSeq;
        e.reInvocation = byNew;
        e.body = kv([['lease until', timeEl(r.lease_expires_at)], ['follows', r.ref_seq ? '#' + r.ref_seq : '']]);
        break;
      case 'commit':
        e.cls = r.outcome;
        e.title = 'Committed';
        e.badge = badge(r.outcome, r.outcome);
        e.body = kv([...outcome(), ['reserve', '#' + r.ref_seq]]);
        break;
      case 'replay':
        e.title = byNew ? 'Replayed to a new execution' : 'Replayed';
        e.badge = badge('deduplicated', 'ok');
        e.reInvocation = byNew;
        e.body = kv([['returned', 'the outcome of #' + r.ref_seq + ' — the effect did not run again']]);
        break;
      case 'resolve':
        if (ref && ref.kind !== 'reserve') {
          e.title = 'Corrected by an admin: the failure applied nothing';
          e.badge = badge(r.outcome, r.outcome);
          e.body = kv([...outcome(), ['note', payload(r, 'note', r.note)], ['corrects', '#' + r.ref_seq]]);
          break;
        }
        e.title = 'Resolved by an operator';
        e.badge = badge(r.outcome, r.outcome);
        e.body = kv([...outcome(), ['note', payload(r, 'note', r.note)], ['interrupted reserve', '#' + r.ref_seq]]);
        break;
      case 'reconcile':
        e.title = 'Reconciled from the downstream\'s answer';
        e.badge = badge(r.outcome, r.outcome);
        e.body = kv([...outcome(), ['evidence', payload(r, 'note', r.note)], ['by', r.actor], ['interrupted reserve', '#' + r.ref_seq]]);
        break;
    }
    return e;
  }

  // ---- audit ----

  async function renderAudit(live, member, params) {
    const form = $('audit-form');
    form.elements.tool.value = params.get('tool') || '';
    form.elements.since.value = params.get('since') || '';
    const box = $('audit');
    box.replaceChildren(el('div', { class: 'card' }, empty('Running the audit (it rehashes the chain)…')));
    const { audit, violations } = await loadAudit({ tool: params.get('tool'), since: params.get('since') });
    if (!live()) return;
    const cards = auditMembers(audit).map((name) => auditSection(name, audit[name]));
    box.replaceChildren(...[violationWarning(violations), ...cards].filter(Boolean));
    if (member) {
      const target = $('audit-' + member);
      if (target) target.scrollIntoView({ block: 'start' });
    }
  }

  function auditSection(name, list) {
    const meta = AUDIT_MEMBERS[name] || {};
    list = Array.isArray(list) ? list : [];
    const n = list.length;
    return el('article', { class: 'card', id: 'audit-' + name, data: { member: name } },
      el('div', { class: 'section-head' }, el('h3', null, memberTitle(name)), badge(String(n), n && meta.attention ? 'warn' : '')),
      meta.desc ? el('p', { class: 'section-desc' }, meta.desc) : null,
      n ? genericTable(list) : empty('None.'));
  }

  // genericTable renders a list of objects with one column per field.
  function genericTable(list) {
    const cols = [];
    for (const row of list) if (row && typeof row === 'object') for (const k of Object.keys(row)) if (!cols.includes(k)) cols.push(k);
    const body = list.map((row) => el('tr', { class: row && row.awaiting_person === true ? 'attention' : '' },
      cols.map((c) => el('td', null, cell(c, row ? row[c] : undefined)))));
    return el('div', { class: 'table-wrap' }, el('table', null,
      el('thead', null, el('tr', null, cols.map((c) => el('th', null, COLUMN_LABELS[c] || c.replace(/_/g, ' '))))),
      el('tbody', null, body)));
  }

  function cell(name, v) {
    if (v === undefined || v === null || v === '') return el('span', { class: 'muted' }, '—');
    if (name === 'key' && typeof v === 'string') return keyLink(v, 'clip long');
    if (name === 'keys' && Array.isArray(v)) return v.flatMap((k, i) => (i ? [', ', keyLink(String(k))] : [keyLink(String(k))]));
    if (name === 'awaiting_person') return v === true ? badge('yes', 'warn') : 'no';
    if (name === 'outcome' && typeof v === 'string') return badge(v, v === 'succeeded' || v === 'failed' ? v : '');
    if (typeof v === 'boolean') return yesNo(v);
    if (typeof v === 'number' && /_at$/.test(name)) return timeEl(v);
    if (name === 'input_hash' && typeof v === 'string') return el('span', { class: 'mono', title: v }, short(v, 19));
    if (Array.isArray(v)) {
      if (v.every((x) => typeof x !== 'object' || x === null)) {
        const sep = name === 'attempts' ? ' → ' : ', ';
        return el('span', { class: /seqs?$/.test(name) || name === 'attempts' ? 'num' : 'mono' }, v.map((x) => (x === '' ? '—' : String(x))).join(sep));
      }
      return el('pre', null, jsonText(v));
    }
    if (typeof v === 'object') return el('pre', null, jsonText(v));
    if (typeof v === 'number') return el('span', { class: 'num' }, String(v));
    if (/(_id|tool|code)$/.test(name)) return clip(String(v), 'long');
    return String(v);
  }

  // ---- approvals ----

  // The asks a namespace's policy holds for a person (SPEC §13), their
  // answers, and the policy in force. Approver and admin tokens see the
  // asked input and may answer; the server decides, the page only shows
  // its refusals.
  const APPROVAL_STATES = ['pending', 'approved', 'rejected', 'expired', 'consumed'];

  const APPROVAL_ERRORS = {
    self_approval: 'This token asked for the effect: another person must answer it.',
    forbidden: "This token may not answer this ask: it needs the approver or admin role, and to be among the policy rule's approvers.",
    approval_expired: 'The ask expired before the answer. The next reserve of the key asks again.',
    already_answered: 'The ask was answered already: its answer is shown above.',
    unknown_approval: 'No ask has this seq in this namespace.',
  };

  // approvalNotice is what an answer left for the view to show once it
  // has refreshed: the server's refusal of the ask at seq.
  let approvalNotice = null;

  function approvalState(params) {
    const s = params.get('state') || 'pending';
    return s === 'any' || APPROVAL_STATES.includes(s) ? s : 'pending';
  }

  // approvalsQuery is the list's part of the view's hash: its state filter
  // (pending unless said) and page.
  function approvalsQuery(params) {
    const state = approvalState(params);
    return { state: state === 'pending' ? '' : state, after: params.get('after') || '' };
  }

  function approvalBadge(state) {
    return badge(state, 'ap-' + state);
  }

  // timeLeft says how long a pending ask has before it expires.
  function timeLeft(a) {
    if (a.state !== 'pending') return null;
    const s = Math.round((a.expires_at - Date.now()) / 1000);
    return el('span', { class: s > 0 ? 'muted' : 'warn-text' }, s > 0 ? ' (' + human(s) + ' left)' : ' (expiring)');
  }

  async function renderApprovals(live, arg, params) {
    const state = approvalState(params);
    const after = params.get('after') || '';
    $('approvals-form').elements.state.value = state;
    const seq = /^[1-9][0-9]*$/.test(arg) ? arg : '';
    const notice = approvalNotice && approvalNotice.seq === seq ? approvalNotice : null;
    approvalNotice = null;

    $('approvals').replaceChildren(empty('Loading…'));
    $('approval-card').hidden = !seq;
    $('approval-form').hidden = true;
    $('approval-error').hidden = true;
    if (seq) {
      $('approval-title').textContent = 'Ask #' + seq;
      $('approval-detail').replaceChildren(empty('Loading…'));
    }
    $('policy').replaceChildren(empty('Loading…'));
    $('policy-seq').textContent = '';

    const list = api('v1/approvals' + query({ state: state === 'any' ? '' : state, after }));
    const one = seq ? api('v1/approvals/' + seq).catch((err) => err) : Promise.resolve(null);
    const policy = api('v1/namespaces/' + encodeURIComponent(namespace()) + '/policy').catch((err) => err);
    const page = await list; // a refused token goes to the prompt
    if (!live()) return;
    renderApprovalList(page, state, after, seq, params);
    const [a, p] = await Promise.all([one, policy]);
    if (!live()) return;
    if (seq) renderApproval(a, seq, notice);
    renderPolicy(p);
  }

  function renderApprovalList(page, state, after, seq, params) {
    const list = page.approvals;
    $('approvals-title').textContent = (state === 'any' ? 'Asks' : state.charAt(0).toUpperCase() + state.slice(1) + ' asks') +
      (list.length ? ' · ' + list.length + (page.next_after === null ? '' : '+') : '');
    const next = $('ap-page-next');
    next.disabled = page.next_after === null;
    next.dataset.after = page.next_after === null ? '' : String(page.next_after);
    $('ap-page-first').disabled = !after;
    if (!list.length) {
      $('approvals').replaceChildren(empty(state === 'pending' ? 'No ask awaits an answer.' : state === 'any' ? 'No ask was made in this namespace.' : 'No ask is ' + state + '.'));
      return;
    }
    const q = query(approvalsQuery(params));
    const tbody = el('tbody');
    for (const a of list) {
      const href = '#approvals/' + a.seq + q;
      const row = el('tr', { class: 'row' + (String(a.seq) === seq ? ' selected' : ''), data: { seq: String(a.seq) } },
        el('td', { class: 'num' }, el('a', { href }, String(a.seq))),
        el('td', null, clip(a.tool)),
        el('td', null, keyLink(a.idempotency_key)),
        el('td', { class: 'summary' }, a.summary ? el('span', { class: 'clip', title: a.summary }, a.summary) : el('span', { class: 'muted' }, '—')),
        el('td', null, clip(a.actor)),
        el('td', { class: 'nowrap' }, timeEl(a.asked_at, '')),
        el('td', { class: 'nowrap' }, timeEl(a.expires_at, ''), timeLeft(a)),
        el('td', null, clip(a.execution_id), el('span', { class: 'muted' }, ' #' + a.attempt)),
        el('td', null, approvalBadge(a.state)));
      row.addEventListener('click', (ev) => {
        if (ev.target.closest('a')) return;
        location.hash = href;
      });
      tbody.append(row);
    }
    $('approvals').replaceChildren(el('div', { class: 'table-wrap' }, el('table', { id: 'approvals-table' },
      el('thead', null, el('tr', null, ['seq', 'tool', 'key', 'summary', 'asked by', 'asked (UTC)', 'expires (UTC)', 'execution', 'state'].map((c) => el('th', null, c)))),
      tbody)));
  }

  function renderApproval(a, seq, notice) {
    const box = $('approval-detail');
    const form = $('approval-form');
    if (a instanceof Error) {
      if (a.status === 401) throw a;
      if (a.code === 'pruned') {
        box.replaceChildren(el('div', { class: 'muted', id: 'approval-pruned' }, 'Ask #' + seq + ' was ' + prunedBy(a) + '.'));
        return;
      }
      box.replaceChildren(el('div', { class: 'login-error' }, a.code === 'unknown_approval' ? APPROVAL_ERRORS.unknown_approval : 'Could not load: ' + a.code + ': ' + a.message));
      return;
    }
    const ans = a.answer;
    const answer = ans
      ? el('span', { id: 'approval-answer' }, badge(ans.decision === 'approve' ? 'approved' : 'rejected', ans.decision === 'approve' ? 'ok' : 'bad'),
        ' by ', el('span', { class: 'mono' }, ans.actor), ans.role ? ' (' + ans.role + ')' : '', ' at ', timeEl(ans.recorded_at), ' · receipt #' + ans.seq,
        ans.note ? el('div', { class: 'note', id: 'approval-answer-note' }, ans.note) : null)
      : '';
    const consumer = a.consumed_by
      ? el('span', { id: 'approval-consumer' }, 'reserve #' + a.consumed_by.seq + ' by execution ', el('span', { class: 'mono' }, a.consumed_by.execution_id), ', attempt ' + a.consumed_by.attempt)
      : '';
    box.replaceChildren(
      el('div', { class: 'key-head' }, el('span', { class: 'key-name', id: 'approval-tool' }, a.tool), approvalBadge(a.state)),
      kv([
        ['summary', a.summary ? el('span', { id: 'approval-summary' }, a.summary) : el('span', { class: 'muted' }, 'none given')],
        ['idempotency key', keyLink(a.idempotency_key, 'long')],
        ['asked by', el('span', { class: 'mono', id: 'approval-actor' }, a.actor)],
        ['execution', el('span', null, el('span', { class: 'mono' }, a.execution_id), ', attempt ' + a.attempt)],
        ['effect', a.effect + (a.idempotent ? ', idempotent' : ', not idempotent')],
        ['asked', timeEl(a.asked_at)],
        ['expires', el('span', null, timeEl(a.expires_at), timeLeft(a))],
        ['input hash', el('span', { class: 'mono' }, a.input_hash)],
        ['answer', answer],
        ['consumed by', consumer],
      ]),
      inputSection(a));
    if (form.dataset.seq !== seq) form.elements.note.value = '';
    form.dataset.seq = seq;
    form.hidden = a.state !== 'pending';
    setAnswerBusy(false);
    if (notice) {
      const err = notice.err;
      const why = APPROVAL_ERRORS[err.code];
      const b = $('approval-error');
      b.replaceChildren(el('strong', null, err.code || 'error'), ': ', err.message || String(err), why ? el('div', { class: 'small' }, why) : null);
      b.hidden = false;
    }
  }

  // inputSection shows the asked input: approver and admin tokens get it
  // (null once deleted), with whether it hashes to the ask's input_hash.
  function inputSection(a) {
    const head = el('div', { class: 'section-head' }, el('h3', null, 'Asked input'));
    if (!('input' in a)) {
      return el('div', { class: 'ask-input' }, head, empty('Shown to approver and admin tokens only.'));
    }
    if (a.input === null) {
      head.append(badge('input deleted', 'warn'));
      return el('div', { class: 'ask-input', id: 'approval-input-box' }, head,
        empty('The asked input was deleted (past its retention): only its hash remains on the chain.'));
    }
    head.append(a.input_verified
      ? badge('verified: matches the input hash', 'ok')
      : badge('not verified: does not match the input hash', 'bad'));
    return el('div', { class: 'ask-input', id: 'approval-input-box' }, head, el('pre', { id: 'approval-input' }, jsonText(a.input)));
  }

  function renderPolicy(p) {
    const box = $('policy');
    if (p instanceof Error) {
      if (p.status === 401) throw p;
      box.replaceChildren(el('div', { class: 'login-error' }, 'Could not load: ', p.code, ': ', p.message));
      return;
    }
    const none = !p.seq;
    $('policy-seq').textContent = none ? 'none set' : 'set at receipt #' + p.seq;
    box.replaceChildren(
      none ? el('p', { class: 'muted small' }, 'This namespace has no policy: its reserves proceed without approval.') : '',
      el('pre', { id: 'policy-json' }, jsonText(p.policy)));
  }

  function setAnswerBusy(busy) {
    $('approval-approve').disabled = busy;
    $('approval-reject').disabled = busy;
  }

  // answerApproval posts the person's decision on the ask the view shows,
  // then refreshes the view (list and ask); a refusal stays on screen.
  async function answerApproval(decision) {
    const form = $('approval-form');
    const seq = form.dataset.seq;
    if (!seq || form.hidden) return;
    const body = { decision };
    const note = form.elements.note.value.trim();
    if (note) body.note = note;
    setAnswerBusy(true);
    $('approval-error').hidden = true;
    const my = generation;
    try {
      await request('v1/approvals/' + seq, [200, 201], body);
      form.elements.note.value = '';
    } catch (err) {
      if (err.status === 401) {
        showLogin(err);
        return;
      }
      approvalNotice = { seq, err };
    } finally {
      setAnswerBusy(false);
    }
    if (my === generation) route();
  }

  // ---- wiring ----

  function setHash(view, params) {
    const h = '#' + view + query(params);
    if (location.hash === h) route();
    else location.hash = h;
  }

  function formValues(form, names) {
    const out = {};
    for (const n of names) out[n] = form.elements[n].value.trim();
    return out;
  }

  function init() {
    window.addEventListener('hashchange', route);
    $('refresh').addEventListener('click', route);
    $('namespace').addEventListener('change', (ev) => {
      const ns = ev.target.value;
      if (ns === 'default') sessionStorage.removeItem(NS_KEY);
      else sessionStorage.setItem(NS_KEY, ns);
      route();
    });
    $('forget').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      authSeen = null;
      route();
    });
    $('login-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const t = $('token').value.trim();
      if (!t) return;
      sessionStorage.setItem(TOKEN_KEY, t);
      $('token').value = '';
      route();
    });
    $('receipts-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const v = formValues(ev.target, RECEIPT_FILTERS);
      if (v.limit === '50') delete v.limit;
      setHash('receipts', v);
    });
    $('receipts-reset').addEventListener('click', () => setHash('receipts', {}));
    $('page-next').addEventListener('click', () => {
      const p = parseHash().params;
      p.set('after', $('page-next').dataset.after);
      setHash('receipts', Object.fromEntries(p));
    });
    $('page-first').addEventListener('click', () => {
      const p = parseHash().params;
      p.delete('after');
      setHash('receipts', Object.fromEntries(p));
    });
    $('key-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const k = ev.target.elements.key.value.trim();
      location.hash = '#key/' + encodeURIComponent(k);
    });
    $('audit-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      setHash('audit', formValues(ev.target, ['tool', 'since']));
    });
    $('audit-reset').addEventListener('click', () => setHash('audit', {}));
    $('approvals-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const state = ev.target.elements.state.value;
      setHash('approvals', { state: state === 'pending' ? '' : state });
    });
    $('ap-page-next').addEventListener('click', () => {
      const p = parseHash().params;
      setHash('approvals', { ...approvalsQuery(p), after: $('ap-page-next').dataset.after });
    });
    $('ap-page-first').addEventListener('click', () => {
      setHash('approvals', { ...approvalsQuery(parseHash().params), after: '' });
    });
    $('approval-close').addEventListener('click', (ev) => {
      ev.preventDefault();
      setHash('approvals', approvalsQuery(parseHash().params));
    });
    $('approval-form').addEventListener('submit', (ev) => ev.preventDefault());
    $('approval-approve').addEventListener('click', () => answerApproval('approve'));
    $('approval-reject').addEventListener('click', () => answerApproval('reject'));
    $('r-outcome').addEventListener('change', resolveFields);
    $('resolve-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      resolveKey();
    });
    route();
  }

  init();
})();
