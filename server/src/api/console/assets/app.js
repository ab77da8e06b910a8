// The Sundial console: a client of the REST API (/api/v1, see /api/v1/openapi.json).
// Pages are rendered from the hash (#/jobs, #/jobs/<id>, #/runs/<schedule_id>,
// #/executors, #/new, #/login); the bearer token lives in sessionStorage only.
// Everything shown is built with DOM calls (never innerHTML), so job ids, outputs and
// log lines are always text.
'use strict';

const TOKEN_KEY = 'sundial.token';
const FINAL = ['RUN_STATE_SUCCEEDED', 'RUN_STATE_FAILED', 'RUN_STATE_TIMED_OUT', 'RUN_STATE_CANCELLED', 'RUN_STATE_SKIPPED'];
const JOBS_PAGE = 50;
const RUNS_PAGE = 20;

let me = null; // GET /api/v1/whoami: {caller, name, mayWrite, devMode}
let view = 0; // grows at every navigation: a page's late work checks it is still shown

// ---- the REST API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'UNAVAILABLE', 'the server does not answer (' + e.message + ')');
  }
  const text = await resp.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : {};
  } catch (_) {
    json = null;
  }
  if (!resp.ok) {
    const err = json && json.error ? json.error : { code: String(resp.status), message: text.slice(0, 200) };
    throw new ApiError(resp.status, err.code, err.message);
  }
  return json || {};
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v !== undefined && v !== null && v !== '') q.append(k, v);
  }
  const s = q.toString();
  return s ? '?' + s : '';
}

const enc = encodeURIComponent;

// ---- building the page

function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  let value;
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value') value = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === undefined || kid === null || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  if (value !== undefined) el.value = value;
  return el;
}

function show(my, ...nodes) {
  if (my !== view) return false;
  document.getElementById('main').replaceChildren(...nodes.filter((n) => n));
  return true;
}

function errorBox(e) {
  const what = e instanceof ApiError && e.code ? e.code + ': ' : '';
  return h('div', { class: 'error', role: 'alert' }, what + (e.message || String(e)));
}

function badge(text, kind) {
  return h('span', { class: 'badge ' + (kind || '') }, text);
}

function short(enumName, prefix) {
  return (enumName || '').replace(prefix, '');
}

function runBadge(state) {
  const s = short(state || 'RUN_STATE_UNSPECIFIED', 'RUN_STATE_');
  const kind = { SUCCEEDED: 'ok', FAILED: 'bad', TIMED_OUT: 'bad', CANCELLED: 'warn', SKIPPED: '', RUNNING: 'info', DISPATCHED: 'info', WAITING: 'warn', TRIGGERED: 'info' }[s];
  return badge(s, kind);
}

function jobBadge(state) {
  const s = short(state, 'JOB_STATE_');
  return badge(s, { ACTIVE: 'ok', PAUSED: 'warn', FINISHED: '' }[s]);
}

function healthBadge(health) {
  const s = short(health, 'NODE_HEALTH_');
  return badge(s, { HEALTHY: 'ok', SLOW: 'warn', DRAINING: 'warn', NOT_READY: 'warn', FAILING: 'bad', UNRESPONSIVE: 'bad', EVICTED: 'bad' }[s]);
}

function writeButton(label, action, onclick, cls) {
  if (!me || !me.mayWrite) return null;
  return h('button', { class: cls || '', 'data-action': action, onclick }, label);
}

// ---- times

function pad(n) {
  return String(n).padStart(2, '0');
}

// `ms` as wall time in `zone` ("2026-12-05 00:47:36 UTC"), with milliseconds when
// `withMs` (a run's steps are often milliseconds apart).
function fmtTime(ms, zone, withMs) {
  ms = Number(ms);
  if (!ms) return '—';
  const opts = { year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' };
  const frac = withMs ? '.' + String(ms % 1000).padStart(3, '0') : '';
  try {
    return new Intl.DateTimeFormat('sv-SE', { ...opts, timeZone: zone || 'UTC' }).format(new Date(ms)) + frac + ' ' + (zone || 'UTC');
  } catch (_) {
    return new Date(ms).toISOString();
  }
}

// The zone's UTC offset at `ms` ("GMT+2"), which shows a DST change in a list of times.
function offsetAt(ms, zone) {
  try {
    const parts = new Intl.DateTimeFormat('en-US', { timeZone: zone || 'UTC', timeZoneName: 'shortOffset' }).formatToParts(new Date(Number(ms)));
    const part = parts.find((p) => p.type === 'timeZoneName');
    return part ? part.value : '';
  } catch (_) {
    return '';
  }
}

function fireItem(t, zone) {
  return h('li', {}, fmtTime(t, zone), h('span', { class: 'muted' }, ' ' + offsetAt(t, zone) + ', ' + fmtAgo(t)));
}

function fmtAgo(ms) {
  ms = Number(ms);
  if (!ms) return '';
  const d = Math.round((ms - Date.now()) / 1000);
  const a = Math.abs(d);
  const amount = a < 90 ? a + ' s' : a < 5400 ? Math.round(a / 60) + ' min' : a < 129600 ? Math.round(a / 3600) + ' h' : Math.round(a / 86400) + ' d';
  return d >= 0 ? 'in ' + amount : amount + ' ago';
}

function fmtDuration(from, to) {
  from = Number(from);
  to = Number(to);
  if (!from || !to || to < from) return '—';
  const ms = to - from;
  if (ms < 1000) return ms + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
  const parts = [[86400000, ' d'], [3600000, ' h'], [60000, ' min'], [1000, ' s']];
  let rest = ms;
  const out = [];
  for (const [unit, name] of parts) {
    if (rest >= unit) out.push(Math.floor(rest / unit) + name);
    rest %= unit;
  }
  return out.slice(0, 2).join(' ');
}

function when(ms, zone) {
  if (!Number(ms)) return '—';
  return h('span', { title: fmtAgo(ms) }, fmtTime(ms, zone), h('span', { class: 'muted' }, ' (' + fmtAgo(ms) + ')'));
}

// ---- cron in words (the common shapes; anything else is described field by field)

const DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday'];
const DAY_NAMES = { SUN: 0, MON: 1, TUE: 2, WED: 3, THU: 4, FRI: 5, SAT: 6 };
const MONTHS = ['', 'January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October', 'November', 'December'];
const MONTH_NAMES = { JAN: 1, FEB: 2, MAR: 3, APR: 4, MAY: 5, JUN: 6, JUL: 7, AUG: 8, SEP: 9, OCT: 10, NOV: 11, DEC: 12 };

function listWords(field, names, words) {
  const word = (v) => {
    const n = /^\d+$/.test(v) ? Number(v) : names[v.toUpperCase()];
    return n === undefined || !words[n] ? v : words[n];
  };
  return field
    .split(',')
    .map((part) => {
      const range = /^([^-/]+)-([^-/]+)$/.exec(part);
      return range ? word(range[1]) + ' to ' + word(range[2]) : word(part);
    })
    .join(', ');
}

function describeCron(expr) {
  const f = (expr || '').trim().split(/\s+/);
  if (f.length < 5 || f.length > 7) return '';
  const [sec, min, hour, dom, mon, dow, year] = f.length === 5 ? ['0', ...f] : f;
  const num = (s) => /^\d+$/.test(s);
  const step = (s) => {
    const m = /^(?:\*|0)\/(\d+)$/.exec(s);
    return m ? Number(m[1]) : 0;
  };
  const any = (s) => s === '*' || s === '?';
  let time;
  if (sec === '*' && any(min) && any(hour)) time = 'every second';
  else if (step(sec) && any(min) && any(hour)) time = 'every ' + step(sec) + ' seconds';
  else if (num(sec) && any(min) && any(hour)) time = 'every minute' + (sec === '0' ? '' : ' at second ' + sec);
  else if (num(sec) && step(min) && any(hour)) time = 'every ' + step(min) + ' minutes';
  else if (num(sec) && num(min) && any(hour)) time = 'every hour at minute ' + min;
  else if (num(sec) && num(min) && step(hour)) time = 'every ' + step(hour) + ' hours at minute ' + min;
  else if (num(sec) && num(min) && /^\d+(,\d+)*$/.test(hour))
    time = 'at ' + hour.split(',').map((hh) => pad(hh) + ':' + pad(min) + (sec === '0' ? '' : ':' + pad(sec))).join(', ');
  else time = 'at second ' + sec + ', minute ' + min + ', hour ' + hour;
  let days = '';
  if (!any(dom)) days += dom === 'L' ? ' on the last day of the month' : ' on day ' + dom + ' of the month';
  if (!any(dow)) days += ' on ' + listWords(dow, DAY_NAMES, DAYS);
  if (!any(mon)) days += ' in ' + listWords(mon, MONTH_NAMES, MONTHS);
  if (year && !any(year)) days += ' in ' + year;
  if (!days && time.startsWith('at ')) days = ' every day';
  return time + days;
}

// ---- navigation

const ROUTES = [
  [/^\/jobs$/, (m, q, my) => jobsPage(q, my)],
  [/^\/new$/, (m, q, my) => editPage(null, my)],
  [/^\/jobs\/([^/]+)\/edit$/, (m, q, my) => editPage(decodeURIComponent(m[1]), my)],
  [/^\/jobs\/([^/]+)$/, (m, q, my) => jobPage(decodeURIComponent(m[1]), q, my)],
  [/^\/runs\/(.+)$/, (m, q, my) => runPage(decodeURIComponent(m[1]), my)],
  [/^\/executors$/, (m, q, my) => executorsPage(my)],
];

function go(hash) {
  if (location.hash === hash) navigate();
  else location.hash = hash;
}

async function navigate() {
  const my = ++view;
  const started = performance.now();
  const raw = (location.hash || '#/jobs').slice(1);
  const [path, qs] = raw.split('?');
  if (path === '/login') {
    loginPage(my);
    return;
  }
  if (!me) {
    try {
      me = await api('GET', '/api/v1/whoami');
    } catch (e) {
      if (e.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        go('#/login');
      } else show(my, errorBox(e));
      return;
    }
  }
  renderChrome(path);
  const route = ROUTES.find(([re]) => re.test(path));
  if (!route) {
    show(my, h('p', {}, 'No such page. ', h('a', { href: '#/jobs' }, 'Jobs')));
    return;
  }
  try {
    await route[1](route[0].exec(path), new URLSearchParams(qs || ''), my);
    if (my === view) {
      // What the browser test reads: the page shown with its data, how long that took
      // since this navigation and since the document was loaded.
      document.body.dataset.page = decodeURIComponent(path);
      document.body.dataset.renderMs = String(Math.round(performance.now() - started));
      document.body.dataset.sinceLoadMs = String(Math.round(performance.now()));
    }
  } catch (e) {
    if (e.status === 401) {
      me = null;
      sessionStorage.removeItem(TOKEN_KEY);
      go('#/login');
      return;
    }
    show(my, errorBox(e));
  }
}

function renderChrome(path) {
  const link = (href, text, active) => h('a', { href, class: active ? 'current' : '' }, text);
  const who = me.devMode
    ? 'dev mode'
    : (me.name || me.caller) + (me.mayWrite ? '' : ' (read-only)');
  const nav = [
    link('#/jobs', 'Jobs', path.startsWith('/jobs') || path === '/new'),
    link('#/executors', 'Executors', path === '/executors'),
    h('span', { class: 'who', 'data-role': me.mayWrite ? 'writer' : 'reader' }, who),
  ];
  if (sessionStorage.getItem(TOKEN_KEY)) nav.push(h('a', { href: '#/login', onclick: signOut, 'data-action': 'sign-out' }, 'Sign out'));
  document.getElementById('nav').replaceChildren(...nav);
  const banner = document.getElementById('banner');
  banner.hidden = !me.devMode;
  banner.textContent = me.devMode
    ? 'Dev mode: the server has no credentials configured, so anyone who reaches this port may read and change everything. Start it with --bearer-token (and --read-token) before exposing it.'
    : '';
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
}

// ---- login

function loginPage(my) {
  document.getElementById('nav').replaceChildren();
  const input = h('input', { type: 'password', id: 'token', autocomplete: 'off', placeholder: 'bearer token', required: true });
  const msg = h('div');
  const form = h(
    'form',
    {
      class: 'card login',
      onsubmit: async (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        me = null;
        try {
          me = await api('GET', '/api/v1/whoami');
          go('#/jobs');
        } catch (e) {
          sessionStorage.removeItem(TOKEN_KEY);
          msg.replaceChildren(errorBox(e.status === 401 ? new Error('This token is not accepted.') : e));
        }
      },
    },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'An admin or read-only token the server was started with (--bearer-token, --read-token). It is kept in this tab only.'),
    input,
    h('button', { class: 'primary', type: 'submit', 'data-action': 'sign-in' }, 'Sign in'),
    msg,
  );
  show(my, form);
  input.focus();
}

// ---- jobs

async function jobsPage(q, my) {
  const label = q.get('label') || '';
  const state = q.get('state') || '';
  const prefix = q.get('prefix') || '';
  const token = q.get('page') || '';
  const selector = {};
  for (const pair of label.split(',')) {
    const [k, v] = pair.split('=');
    if (k && k.trim()) selector[k.trim()] = (v || '').trim();
  }
  const params = { pageSize: JOBS_PAGE, pageToken: token, state, idPrefix: prefix };
  for (const [k, v] of Object.entries(selector)) params['labelSelector'] = (params['labelSelector'] || []).concat(k + '=' + v);
  const list = await api('GET', '/api/v1/jobs' + query(params));
  const jobs = list.jobs || [];

  const prefixIn = h('input', { name: 'prefix', placeholder: 'id starts with', value: prefix });
  const labelIn = h('input', { name: 'label', placeholder: 'label: team=a,env=prod', value: label });
  const stateIn = h(
    'select',
    { name: 'state', value: state },
    h('option', { value: '' }, 'any state'),
    ['JOB_STATE_ACTIVE', 'JOB_STATE_PAUSED', 'JOB_STATE_FINISHED'].map((s) => h('option', { value: s }, short(s, 'JOB_STATE_').toLowerCase())),
  );
  const filter = h(
    'form',
    {
      class: 'toolbar',
      onsubmit: (ev) => {
        ev.preventDefault();
        go('#/jobs' + query({ prefix: prefixIn.value.trim(), label: labelIn.value.trim(), state: stateIn.value }));
      },
    },
    prefixIn,
    labelIn,
    stateIn,
    h('button', { type: 'submit', 'data-action': 'search' }, 'Search'),
    me.mayWrite ? h('a', { class: 'button', href: '#/new', 'data-action': 'new-job' }, 'New job') : null,
  );

  const rows = jobs.map((j) => {
    const s = j.spec || {};
    const last = h('td', { class: 'last-run muted' }, '…');
    return {
      job: j,
      last,
      row: h(
        'tr',
        { 'data-job': s.id },
        h('td', {}, h('a', { href: '#/jobs/' + enc(s.id) }, s.id), s.name ? h('div', { class: 'muted' }, s.name) : null),
        h('td', {}, h('code', {}, s.cron), h('div', { class: 'muted' }, describeCron(s.cron))),
        h('td', {}, s.timeZone || 'UTC'),
        h('td', {}, Number(j.nextFireTimeMs) ? when(j.nextFireTimeMs, s.timeZone) : '—'),
        h('td', {}, jobBadge(j.state)),
        last,
        h('td', {}, Object.entries(s.labels || {}).map(([k, v]) => badge(k + '=' + v))),
      ),
    };
  });
  const here = { prefix, label, state };
  const pager = h(
    'div',
    { class: 'pager' },
    token ? h('a', { class: 'button', href: '#/jobs' + query(here), 'data-action': 'first-page' }, 'First page') : null,
    list.nextPageToken ? h('a', { class: 'button', href: '#/jobs' + query({ ...here, page: list.nextPageToken }), 'data-action': 'next-page' }, 'Next page') : null,
    h('span', { class: 'muted' }, jobs.length + ' job' + (jobs.length === 1 ? '' : 's') + ' on this page'),
  );
  const table = h(
    'table',
    { id: 'jobs' },
    h('thead', {}, h('tr', {}, ['Job', 'Cron', 'Zone', 'Next fire', 'State', 'Last run', 'Labels'].map((t) => h('th', {}, t)))),
    h('tbody', {}, rows.map((r) => r.row)),
  );
  const empty = jobs.length ? null : h('p', { class: 'muted' }, list.nextPageToken ? 'No match in this stretch of jobs: try the next page.' : 'No jobs match.');
  if (!show(my, h('h1', {}, 'Jobs'), filter, table, empty, pager)) return;
  // Each row's latest run, a few at a time.
  await eachLimited(rows, 6, async (r) => {
    if (my !== view) return;
    const st = await api('GET', '/api/v1/jobs/' + enc(r.job.spec.id) + '/status?nextFires=1').catch(() => null);
    const run = st && st.latestRun;
    r.last.className = 'last-run';
    r.last.replaceChildren(
      run
        ? h('span', {}, h('a', { href: '#/runs/' + enc(run.scheduleId) }, runBadge(run.state)), ' ', h('span', { class: 'muted' }, fmtAgo(run.finishedAtMs || run.startedAtMs || run.triggeredAtMs || run.scheduledAtMs)))
        : h('span', { class: 'muted' }, 'never ran'),
    );
  });
}

async function eachLimited(items, limit, fn) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

// ---- one job

function target(s) {
  if (s.executor) return 'executor ' + (s.executor.group || '') + ' / ' + (s.executor.handler || '');
  if (s.http) return (s.http.method || 'POST') + ' ' + s.http.url;
  return '—';
}

function payloadText(b64) {
  if (!b64) return '';
  try {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (_) {
    return null;
  }
}

function textBase64(text) {
  const bytes = new TextEncoder().encode(text);
  let s = '';
  bytes.forEach((b) => (s += String.fromCharCode(b)));
  return btoa(s);
}

async function jobPage(id, q, my) {
  const token = q.get('runs') || '';
  const [got, status, runs] = await Promise.all([
    api('GET', '/api/v1/jobs/' + enc(id)),
    api('GET', '/api/v1/jobs/' + enc(id) + '/status?nextFires=5'),
    api('GET', '/api/v1/jobs/' + enc(id) + '/runs' + query({ pageSize: RUNS_PAGE, pageToken: token })),
  ]);
  const job = got.job;
  const s = job.spec || {};
  const zone = s.timeZone || 'UTC';
  const msg = h('div');
  const act = (label, action, fn, cls) =>
    writeButton(label, action, async () => {
      try {
        await fn();
      } catch (e) {
        msg.replaceChildren(errorBox(e));
      }
    }, cls);
  const paused = job.state === 'JOB_STATE_PAUSED';
  const actions = h(
    'div',
    { class: 'actions' },
    paused
      ? act('Resume', 'resume', async () => {
          await api('POST', '/api/v1/jobs/' + enc(id) + '/resume', {});
          go(location.hash);
        })
      : act('Pause', 'pause', async () => {
          await api('POST', '/api/v1/jobs/' + enc(id) + '/pause', {});
          go(location.hash);
        }),
    act('Run now', 'trigger', async () => {
      const t = await api('POST', '/api/v1/jobs/' + enc(id) + '/trigger', {});
      msg.replaceChildren(h('div', { class: 'notice' }, 'Queued ', h('a', { href: '#/runs/' + enc(t.scheduleId) }, t.scheduleId), '.'));
      setTimeout(() => my === view && refreshRuns(), 1000);
    }),
    me.mayWrite ? h('a', { class: 'button', href: '#/jobs/' + enc(id) + '/edit', 'data-action': 'edit' }, 'Edit') : null,
    act(
      'Delete',
      'delete',
      async () => {
        if (!confirm('Delete job ' + id + '? Its runs stay readable until they expire.')) return;
        await api('DELETE', '/api/v1/jobs/' + enc(id));
        go('#/jobs');
      },
      'danger',
    ),
  );
  const payload = payloadText(s.payload);
  const definition = h(
    'dl',
    { class: 'kv' },
    [
      ['Name', s.name || '—'],
      ['Cron', h('span', {}, h('code', {}, s.cron), ' ', h('span', { class: 'muted' }, describeCron(s.cron)))],
      ['Time zone', zone],
      ['Target', target(s)],
      ['Routing', short(s.routeStrategy, 'ROUTE_STRATEGY_').toLowerCase() + (s.routeKey ? ' (key ' + s.routeKey + ')' : '')],
      ['Timeout', s.timeoutMs ? fmtDuration(1, 1 + Number(s.timeoutMs)) : 'default'],
      ['Retries', (s.retry && s.retry.maxRetries) || 0],
      ['Misfire', short(s.misfirePolicy, 'MISFIRE_POLICY_').toLowerCase()],
      ['Overlap', short(s.overlapPolicy, 'OVERLAP_POLICY_').toLowerCase()],
      ['Webhook', s.callbackUrl ? s.callbackUrl + (s.appId ? ' (signed by ' + s.appId + ')' : '') : '—'],
      ['Labels', Object.entries(s.labels || {}).map(([k, v]) => badge(k + '=' + v))],
      ['Payload', payload === null ? 'binary, ' + atob(s.payload).length + ' bytes' : payload ? h('code', {}, payload) : '—'],
      ['Version', job.version],
      ['Updated', when(job.updatedAtMs, zone)],
    ].map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]),
  );
  const fires = (status.nextFireTimesMs || []).map((t) => fireItem(t, zone));
  const runsBox = h('div');
  const renderRuns = (list) => {
    runsBox.replaceChildren(
      runsTable(list.runs || [], zone),
      h(
        'div',
        { class: 'pager' },
        token ? h('a', { class: 'button', href: '#/jobs/' + enc(id) }, 'Newest') : null,
        list.nextPageToken ? h('a', { class: 'button', href: '#/jobs/' + enc(id) + query({ runs: list.nextPageToken }), 'data-action': 'older-runs' }, 'Older runs') : null,
      ),
    );
  };
  const refreshRuns = async () => {
    const list = await api('GET', '/api/v1/jobs/' + enc(id) + '/runs' + query({ pageSize: RUNS_PAGE, pageToken: token }));
    if (my === view) renderRuns(list);
  };
  renderRuns(runs);
  // The newest runs keep coming while the page is shown.
  const follow = async () => {
    if (my !== view) return;
    if (!token) await refreshRuns().catch(() => {});
    if (my === view) setTimeout(follow, 2000);
  };
  setTimeout(follow, 2000);
  show(
    my,
    h('h1', {}, h('span', { id: 'job-id' }, id), jobBadge(job.state)),
    actions,
    msg,
    h(
      'div',
      { class: 'split' },
      h('div', { class: 'card' }, definition),
      h('div', { class: 'card' }, h('h2', {}, 'Next fires'), fires.length ? h('ol', { class: 'preview', id: 'next-fires' }, fires) : h('p', { class: 'muted' }, paused ? 'Paused: no fires until resumed.' : 'None armed.')),
    ),
    h('h2', {}, 'Runs'),
    runsBox,
  );
}

function runsTable(runs, zone) {
  if (!runs.length) return h('p', { class: 'muted', id: 'runs' }, 'No runs yet.');
  return h(
    'table',
    { id: 'runs' },
    h('thead', {}, h('tr', {}, ['Run', 'State', 'Attempt', 'Trigger', 'Node', 'Scheduled', 'Duration', 'Webhook'].map((t) => h('th', {}, t)))),
    h(
      'tbody',
      {},
      runs.map((r) =>
        h(
          'tr',
          { 'data-run': r.scheduleId },
          h('td', {}, h('a', { href: '#/runs/' + enc(r.scheduleId) }, r.scheduleNo || r.scheduleId)),
          h('td', {}, runBadge(r.state), r.reason ? h('div', { class: 'muted' }, r.reason) : null),
          h('td', {}, r.attempt || 1),
          h('td', {}, short(r.triggerKind, 'TRIGGER_KIND_').toLowerCase()),
          h('td', { class: 'mono' }, r.nodeId || '—'),
          h('td', {}, fmtTime(r.scheduledAtMs, zone)),
          h('td', {}, fmtDuration(r.startedAtMs, r.finishedAtMs)),
          h('td', {}, r.callbackState ? short(r.callbackState, 'CALLBACK_STATE_').toLowerCase() : '—'),
        ),
      ),
    ),
  );
}

// ---- editing a job (or a new one)

const STRATEGIES = ['ROUND_ROBIN', 'WEIGHTED_ROUND_ROBIN', 'RANDOM', 'LEAST_ACTIVE', 'CONSISTENT_HASH', 'BUSYOVER', 'FAILOVER', 'FIRST', 'SHARDING_BROADCAST'];
const MISFIRE = ['FIRE_ONCE', 'SKIP', 'CATCH_UP'];
const OVERLAP = ['ALLOW', 'FORBID', 'SERIAL', 'REPLACE'];

async function editPage(id, my) {
  if (!me.mayWrite) {
    show(my, errorBox(new Error('This token may only read.')));
    return;
  }
  const job = id ? (await api('GET', '/api/v1/jobs/' + enc(id))).job : null;
  const spec = job ? structuredClone(job.spec) : { timeZone: 'UTC', executor: { group: '', handler: '' } };
  const f = {};
  const field = (name, label, input, hint) => {
    f[name] = input;
    input.name = name;
    input.id = 'f-' + name;
    return [h('label', { for: 'f-' + name }, label), input, hint ? h('div', { class: 'hint muted' }, hint) : null];
  };
  const select = (values, prefix, current) =>
    h('select', { value: current ? short(current, prefix) : values[0] }, values.map((v) => h('option', { value: v }, v.toLowerCase().replaceAll('_', ' '))));
  const payload = payloadText(spec.payload);
  const labels = Object.entries(spec.labels || {}).map(([k, v]) => k + '=' + v).join('\n');
  const kind = spec.http ? 'http' : 'executor';
  const preview = h('ol', { class: 'preview', id: 'preview' });
  const previewMsg = h('div');
  // Fire times from a later day: a DST change ahead can be checked before saving.
  const fromIn = h('input', { id: 'preview-from', placeholder: 'from YYYY-MM-DD (UTC), default now', size: 30 });
  const msg = h('div');
  const form = h(
    'form',
    { class: 'grid card', id: 'job-form', onsubmit: (ev) => save(ev) },
    id ? null : field('id', 'Job id', h('input', { required: true, pattern: '[A-Za-z0-9._-]{1,128}' }), 'letters, digits, . _ -; fixed once created'),
    field('name', 'Name', h('input', { value: spec.name || '' })),
    field('cron', 'Cron', h('input', { required: true, value: spec.cron || '', class: 'mono' }), '5 fields, or 6/7 with seconds first (and a year); Quartz ? L W # too'),
    field('timeZone', 'Time zone', h('input', { value: spec.timeZone || 'UTC' }), 'an IANA name, e.g. Europe/Berlin'),
    field('kind', 'Target', h('select', { value: kind }, h('option', { value: 'executor' }, 'an executor handler'), h('option', { value: 'http' }, 'an HTTP endpoint'))),
    field('group', 'Executor group', h('input', { value: (spec.executor && spec.executor.group) || '' })),
    field('handler', 'Handler', h('input', { value: (spec.executor && spec.executor.handler) || '' })),
    field('url', 'HTTP URL', h('input', { value: (spec.http && spec.http.url) || '' })),
    field('routeStrategy', 'Routing', select(STRATEGIES, 'ROUTE_STRATEGY_', spec.routeStrategy)),
    field('routeKey', 'Route key', h('input', { value: spec.routeKey || '' }), 'consistent hash only'),
    field('timeoutMs', 'Timeout (ms)', h('input', { type: 'number', min: 1, value: spec.timeoutMs || '' }), 'empty: 1 hour'),
    field('maxRetries', 'Retries', h('input', { type: 'number', min: 0, value: (spec.retry && spec.retry.maxRetries) || 0 })),
    field('backoffMs', 'Retry backoff (ms)', h('input', { type: 'number', min: 0, value: (spec.retry && spec.retry.backoffMs) || 0 })),
    field('misfirePolicy', 'Misfire', select(MISFIRE, 'MISFIRE_POLICY_', spec.misfirePolicy)),
    field('overlapPolicy', 'Overlap', select(OVERLAP, 'OVERLAP_POLICY_', spec.overlapPolicy)),
    field('callbackUrl', 'Webhook URL', h('input', { value: spec.callbackUrl || '' })),
    field('appId', 'Signing app', h('input', { value: spec.appId || '' })),
    field('labels', 'Labels', h('textarea', { value: labels }), 'one key=value a line'),
    payload === null ? null : field('payload', 'Payload', h('textarea', { value: payload || '' }), 'text handed to the handler as is'),
    id ? null : field('paused', 'Create paused', h('input', { type: 'checkbox' })),
    h('span'),
    h('div', {}, h('button', { class: 'primary', type: 'submit', 'data-action': 'save' }, id ? 'Save' : 'Create'), ' ', h('a', { href: id ? '#/jobs/' + enc(id) : '#/jobs' }, 'Cancel')),
  );
  const showTarget = () => {
    const http = f.kind.value === 'http';
    for (const n of ['group', 'handler', 'url']) {
      form.querySelectorAll('[for=f-' + n + '], #f-' + n).forEach((el) => (el.hidden = http !== (n === 'url')));
    }
  };
  f.kind.addEventListener('change', showTarget);
  showTarget();

  let previewTimer = null;
  const refreshPreview = () => {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(async () => {
      if (my !== view) return;
      try {
        const from = fromIn.value.trim();
        const afterMs = /^\d{4}-\d{2}-\d{2}$/.test(from) ? Date.parse(from + 'T00:00:00Z') - 1 : '';
        if (from && !afterMs) throw new Error('from: not a date (YYYY-MM-DD)');
        const p = await api('GET', '/api/v1/fire-times' + query({ cron: f.cron.value.trim(), timeZone: f.timeZone.value.trim(), count: 8, afterMs }));
        const zone = f.timeZone.value.trim() || 'UTC';
        previewMsg.replaceChildren();
        preview.replaceChildren(...(p.fireTimesMs || []).map((t) => fireItem(t, zone)));
        if (!(p.fireTimesMs || []).length) previewMsg.replaceChildren(h('p', { class: 'muted' }, 'This schedule never fires.'));
      } catch (e) {
        preview.replaceChildren();
        previewMsg.replaceChildren(errorBox(e));
      }
    }, 250);
  };
  f.cron.addEventListener('input', refreshPreview);
  f.timeZone.addEventListener('input', refreshPreview);
  fromIn.addEventListener('input', refreshPreview);
  if (spec.cron) refreshPreview();

  async function save(ev) {
    ev.preventDefault();
    const out = structuredClone(spec);
    const text = (n) => f[n].value.trim();
    const set = (k, v) => {
      if (v === '' || v === undefined) delete out[k];
      else out[k] = v;
    };
    if (!id) out.id = text('id');
    set('name', text('name'));
    out.cron = text('cron');
    set('timeZone', text('timeZone'));
    delete out.executor;
    delete out.http;
    if (f.kind.value === 'http') out.http = { ...((spec.http) || {}), url: text('url') };
    else out.executor = { group: text('group'), handler: text('handler') };
    out.routeStrategy = 'ROUTE_STRATEGY_' + f.routeStrategy.value;
    set('routeKey', text('routeKey'));
    set('timeoutMs', text('timeoutMs'));
    out.retry = { ...(spec.retry || {}), maxRetries: Number(text('maxRetries') || 0), backoffMs: text('backoffMs') || '0' };
    out.misfirePolicy = 'MISFIRE_POLICY_' + f.misfirePolicy.value;
    out.overlapPolicy = 'OVERLAP_POLICY_' + f.overlapPolicy.value;
    set('callbackUrl', text('callbackUrl'));
    set('appId', text('appId'));
    out.labels = {};
    for (const line of f.labels.value.split('\n')) {
      const i = line.indexOf('=');
      if (line.trim() && i > 0) out.labels[line.slice(0, i).trim()] = line.slice(i + 1).trim();
    }
    if (f.payload) set('payload', f.payload.value ? textBase64(f.payload.value) : '');
    if (!id) out.paused = f.paused.checked;
    try {
      if (id) {
        await api('PUT', '/api/v1/jobs/' + enc(id), { spec: out, expectedVersion: job.version });
        go('#/jobs/' + enc(id));
      } else {
        await api('POST', '/api/v1/jobs', { spec: out });
        go('#/jobs/' + enc(out.id));
      }
    } catch (e) {
      if (e.code === 'ABORTED') {
        msg.replaceChildren(
          h(
            'div',
            { class: 'error', role: 'alert', id: 'conflict' },
            'Someone changed this job after you opened it (you started from version ' + job.version + '): your edit was not saved. ',
            h('a', { href: '#/jobs/' + enc(id) }, 'See the current definition'),
            ' and edit again.',
          ),
        );
      } else msg.replaceChildren(errorBox(e));
      window.scrollTo(0, 0);
    }
  }

  show(
    my,
    h('h1', {}, id ? 'Edit ' + id : 'New job', job ? h('span', { class: 'muted' }, 'version ' + job.version) : null),
    msg,
    h('div', { class: 'split' }, form, h('div', { class: 'card' }, h('h2', {}, 'Next fire times'), h('p', { class: 'muted' }, 'As the scheduler would fire this cron in this zone (DST included), before saving.'), fromIn, previewMsg, preview)),
  );
}

// ---- one run

async function runPage(sid, my) {
  const logBox = h('pre', { class: 'log', id: 'log' });
  let lastSeq = '';
  let lines = 0;
  const head = h('div');
  const msg = h('div');
  let zone = 'UTC';

  const fetchLogs = async () => {
    for (let i = 0; i < 20; i++) {
      const page = await api('GET', '/api/v1/runs/' + enc(sid) + '/logs' + query({ pageSize: 1000, pageToken: lastSeq }));
      for (const l of page.lines || []) {
        const level = (l.level || 'info').toLowerCase();
        logBox.append(h('span', { class: 'lvl-' + level }, fmtTime(l.timeMs, zone).slice(11, 19) + ' ' + level.padEnd(5) + ' #' + (l.attempt || 1) + ' ' + l.message + '\n'));
        lastSeq = l.seq;
        lines++;
      }
      if (!page.nextPageToken) break;
    }
  };
  const render = (run) => {
    const final = FINAL.includes(run.state);
    head.replaceChildren(
      h('h1', {}, h('span', { id: 'run-id' }, run.scheduleId), runBadge(run.state)),
      h(
        'div',
        { class: 'actions' },
        h('a', { class: 'button', href: '#/jobs/' + enc(run.jobId) }, 'Job ' + run.jobId),
        final
          ? null
          : writeButton('Cancel run', 'cancel', async () => {
              try {
                await api('POST', '/api/v1/runs/' + enc(sid) + '/cancel', { reason: 'cancelled from the console' });
                poll(true);
              } catch (e) {
                msg.replaceChildren(errorBox(e));
              }
            }, 'danger'),
      ),
      msg,
      h('div', { class: 'split' }, h('div', { class: 'card' }, h('h2', {}, 'Timeline'), timeline(run, zone)), h('div', { class: 'card' }, runFacts(run))),
    );
  };
  // A manual trigger is answered with its schedule_id once it is queued; the run is
  // recorded when a dispatcher begins it, a moment later (longer on a busy server).
  // Until then the page says so and asks again (every 0.5 s, up to 30 s) rather than
  // answering "not found".
  const firstRead = async () => {
    for (let i = 0; ; i++) {
      try {
        return await api('GET', '/api/v1/runs/' + enc(sid));
      } catch (e) {
        if (e.status !== 404 || i >= 60 || my !== view) throw e;
        show(my, h('p', { class: 'muted', id: 'run-queued' }, 'Run ' + sid + ' is queued: waiting for it to begin…'));
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  };
  const first = await firstRead();
  try {
    zone = ((await api('GET', '/api/v1/jobs/' + enc(first.run.jobId))).job.spec.timeZone) || 'UTC';
  } catch (_) {
    zone = 'UTC'; // the job may be gone; its runs stay readable
  }
  render(first.run);
  await fetchLogs();
  const logHead = h('h2', {}, 'Log', h('span', { class: 'muted', id: 'log-state' }, ''));
  if (!show(my, head, logHead, logBox)) return;
  const state = (run) => {
    document.getElementById('log-state').textContent = FINAL.includes(run.state) ? ' (' + lines + ' lines)' : ' (following…)';
  };
  state(first.run);
  async function poll(once) {
    if (my !== view) return;
    try {
      const got = await api('GET', '/api/v1/runs/' + enc(sid));
      if (my !== view) return;
      render(got.run);
      await fetchLogs();
      state(got.run);
      if (!FINAL.includes(got.run.state) && !once) setTimeout(poll, 1000);
    } catch (e) {
      if (my === view) msg.replaceChildren(errorBox(e));
    }
  }
  if (!FINAL.includes(first.run.state)) setTimeout(poll, 1000);
}

// A run's timeline: its history as the store noted it (each state entered, attempt,
// node and webhook attempt); a record written before histories were kept is told from
// its fields.
function timeline(run, zone) {
  const items = [];
  const item = (cls, what, at, detail) => items.push(h('li', { class: cls }, h('strong', {}, what), at ? ' ' + fmtTime(at, zone, true) : '', detail ? h('div', { class: 'muted' }, detail) : null));
  item('info', 'Planned', run.scheduledAtMs, 'schedule ' + run.scheduleNo + ', triggered (' + short(run.triggerKind, 'TRIGGER_KIND_').toLowerCase() + ') from job version ' + (run.jobVersion || '—'));
  if (run.history && run.history.length) {
    for (const e of run.history) {
      const attempt = 'attempt ' + (e.attempt || 1);
      const why = e.detail ? ': ' + e.detail : '';
      switch (e.what) {
        case 'WAITING':
          item('', 'Waiting', e.atMs, attempt + why);
          break;
        case 'DISPATCHED':
          item('info', 'Dispatched to ' + e.nodeId, e.atMs, attempt);
          break;
        case 'RUNNING':
          item('info', 'Started on ' + (e.nodeId || 'its node'), e.atMs, attempt);
          break;
        case 'WEBHOOK':
          item(/HTTP 2\d\d$/.test(e.detail || '') ? 'ok' : 'bad', 'Webhook attempt', e.atMs, e.detail || '');
          break;
        default: {
          const state = e.what.charAt(0) + e.what.slice(1).toLowerCase().replace('_', ' ');
          item(e.what === 'SUCCEEDED' ? 'ok' : FINAL.includes('RUN_STATE_' + e.what) ? 'bad' : 'info', state, e.atMs, attempt + (e.nodeId ? ' on ' + e.nodeId : '') + why);
        }
      }
    }
    if (run.callbackState === 'CALLBACK_STATE_PENDING') item('', 'Webhook pending', null, (run.callbackAttempts || 0) + ' attempts so far');
    return h('ol', { class: 'timeline', id: 'timeline' }, items);
  }
  item('info', 'Triggered', run.triggeredAtMs, null);
  const state = short(run.state, 'RUN_STATE_');
  if (state === 'WAITING') item('', 'Waiting', null, run.reason || 'for a node with room');
  if ((run.attempt || 1) > 1) item('', 'Retried', null, 'attempt ' + run.attempt + (run.reason && run.reason.startsWith('retry') ? ': ' + run.reason : ''));
  if (run.nodeId) item('info', 'Dispatched to ' + run.nodeId, null, 'attempt ' + (run.attempt || 1) + ', fencing token ' + run.fencingToken);
  if (Number(run.startedAtMs)) item('info', 'Started', run.startedAtMs, run.progressMessage ? 'progress ' + (run.progressPercent || 0) + '%: ' + run.progressMessage : null);
  if (FINAL.includes(run.state)) {
    const ok = state === 'SUCCEEDED';
    item(ok ? 'ok' : 'bad', state.charAt(0) + state.slice(1).toLowerCase().replace('_', ' '), run.finishedAtMs, [run.errorCode, run.errorMessage || run.reason].filter(Boolean).join(': ') || (ok ? 'after ' + fmtDuration(run.startedAtMs, run.finishedAtMs) : null));
  }
  if (run.callbackState) {
    const cb = short(run.callbackState, 'CALLBACK_STATE_');
    const detail = (run.callbackAttempts || 0) + ' attempt' + (run.callbackAttempts === 1 ? '' : 's') + (run.callbackStatus ? ', last answer HTTP ' + run.callbackStatus : '') + (run.callbackError ? ', ' + run.callbackError : '');
    item(cb === 'DONE' ? 'ok' : cb === 'FAILED' ? 'bad' : '', 'Webhook ' + cb.toLowerCase(), null, detail);
  }
  return h('ol', { class: 'timeline', id: 'timeline' }, items);
}

function runFacts(run) {
  const output = payloadText(run.output);
  const facts = [
    ['Job', h('a', { href: '#/jobs/' + enc(run.jobId) }, run.jobId)],
    ['Attempt', run.attempt || 1],
    ['Node', run.nodeId || '—'],
    ['Reason', run.reason || '—'],
    ['Duration', fmtDuration(run.startedAtMs, run.finishedAtMs)],
    ['Output', output === null ? 'binary' : output ? h('code', {}, output) : '—'],
  ];
  if (run.shardTotal) {
    const shards = [];
    for (let i = 0; i < run.shardTotal; i++) shards.push(h('a', { href: '#/runs/' + enc(run.scheduleId + '#' + i) }, '#' + i), ' ');
    facts.push(['Shards', h('span', {}, (run.shardsDone || 0) + ' of ' + run.shardTotal + ' done, ' + (run.shardsSucceeded || 0) + ' succeeded: ', shards)]);
  }
  if (run.parentScheduleId) facts.push(['Broadcast run', h('a', { href: '#/runs/' + enc(run.parentScheduleId) }, run.parentScheduleId)]);
  return h('dl', { class: 'kv' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

// ---- executors

async function executorsPage(my) {
  const list = await api('GET', '/api/v1/nodes');
  const nodes = (list.nodes || []).sort((a, b) => (a.group + a.nodeId).localeCompare(b.group + b.nodeId));
  const msg = h('div');
  const rows = nodes.map((n) => {
    const draining = n.health === 'NODE_HEALTH_DRAINING';
    return h(
      'tr',
      { 'data-node': n.nodeId },
      h('td', { class: 'mono' }, n.nodeId),
      h('td', {}, n.group),
      h('td', {}, (n.handlers || []).join(', ')),
      h('td', {}, healthBadge(n.health), n.healthReason ? h('div', { class: 'muted' }, n.healthReason) : null),
      h('td', {}, (n.active || 0) + ' / ' + (n.maxConcurrency || '∞')),
      h('td', {}, n.weight || 1),
      h('td', {}, (100 * (n.successRate === undefined ? 1 : n.successRate)).toFixed(0) + '%', Number(n.meanDurationMs) ? h('div', { class: 'muted' }, n.meanDurationMs + ' ms mean') : null),
      h('td', {}, fmtAgo(n.lastHeartbeatMs)),
      h('td', { class: 'mono' }, n.serverInstance || '—'),
      h(
        'td',
        {},
        draining
          ? writeButton('Undrain', 'undrain', async () => {
              try {
                await api('POST', '/api/v1/nodes/' + enc(n.nodeId) + '/undrain', { reason: 'undrained from the console' });
                go('#/executors');
              } catch (e) {
                msg.replaceChildren(errorBox(e));
              }
            })
          : writeButton('Drain', 'drain', async () => {
              const reason = prompt('Drain ' + n.nodeId + ': it finishes what it holds and gets no new runs until undrained. Reason?', 'maintenance');
              if (reason === null) return;
              try {
                await api('POST', '/api/v1/nodes/' + enc(n.nodeId) + '/drain', { reason });
                go('#/executors');
              } catch (e) {
                msg.replaceChildren(errorBox(e));
              }
            }),
      ),
    );
  });
  show(
    my,
    h('h1', {}, 'Executors'),
    msg,
    nodes.length
      ? h('table', { id: 'nodes' }, h('thead', {}, h('tr', {}, ['Node', 'Group', 'Handlers', 'Health', 'Active / window', 'Weight', 'Success', 'Last heartbeat', 'Instance', ''].map((t) => h('th', {}, t)))), h('tbody', {}, rows))
      : h('p', { class: 'muted' }, 'No executor is connected.'),
  );
  // Health changes with heartbeats (a drain shows once the node reports it): the list
  // is read again every 3 s while it is shown.
  setTimeout(() => {
    if (my === view) executorsPage(my).catch(() => {});
  }, 3000);
}

window.addEventListener('hashchange', navigate);
window.addEventListener('DOMContentLoaded', navigate);
