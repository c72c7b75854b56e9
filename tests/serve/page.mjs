// The comparison page at `/` in headless Chromium (puppeteer-core, the Debian chromium): fill the
// form, run two policies at once, wait until both panes are done, check what they show, save a
// screenshot; a server error lands in its pane. With KEYED_URL (a server started with --api-key
// SERVE_KEY): the key typed is sent as a Bearer token, and without it both panes show the 401.
// env: SERVE_URL, SCREENSHOT (the PNG to write), KEYED_URL and SERVE_KEY (optional).
// Prints one `ok: ...` or `FAIL: ...` line per check; exits 1 on a crash.
import puppeteer from 'puppeteer-core';

const { SERVE_URL: url, SCREENSHOT: shot, KEYED_URL: keyedUrl, SERVE_KEY: key } = process.env;
const ok = (what) => console.log(`ok: ${what}`);
const fail = (what) => console.log(`FAIL: ${what}`);
const check = (cond, what, detail = '') => (cond ? ok(what) : fail(detail ? `${what}: ${detail}` : what));
const short = (s) => JSON.stringify(s.length > 70 ? s.slice(0, 70) + '...' : s);
const prompt = 'Once upon a time, there was a little girl named Lily. She loved to play in the park with her '
  + 'dog, Max. Every morning they ran to the big tree by the pond, where the ducks swam and the wind sang in '
  + 'the leaves. One day, Lily found a shiny red box under the tree.';

// Opens base + '/' in a new tab; returns helpers bound to it.
async function openPage(browser, base) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const errors = [], requests = [];
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('request', (r) => requests.push(r.url()));
  const res = await page.goto(`${base}/`, { waitUntil: 'load', timeout: 15000 });
  const setValue = (sel, v) => page.$eval(sel, (el, v) => { el.value = v; }, v);
  const settle = () => page.waitForFunction(
    () => ['#pane-a', '#pane-b'].every((s) => ['done', 'error'].includes(document.querySelector(s).dataset.state)),
    { timeout: 30000, polling: 100 });
  const panes = () => page.$$eval('#pane-a, #pane-b', (ps) => ps.map((p) => ({
    state: p.dataset.state, out: p.querySelector('.out').innerText, stats: p.querySelector('.stats').innerText,
    head: p.querySelector('h2').innerText })));
  // Clicks #run once it is enabled, waits until both requests went out, then until both panes end.
  const posts = () => requests.filter((u) => u.endsWith('/v1/completions')).length;
  const run = async () => {
    await page.waitForFunction(() => !document.querySelector('#run').disabled, { timeout: 30000, polling: 50 });
    const before = posts();
    await page.click('#run');
    for (let i = 0; i < 100 && posts() < before + 2; i++) await new Promise((r) => setTimeout(r, 50));
    if (posts() < before + 2) fail(`#run sent ${posts() - before} requests, not 2`);
    await settle();
  };
  return { page, res, errors, requests, setValue, settle, panes, run };
}

async function withoutKey(browser) {
  const { page, res, errors, requests, setValue, settle, panes, run } = await openPage(browser, url);
  check(res.status() === 200 && /text\/html/.test(res.headers()['content-type']),
        `GET / ${res.status()} ${res.headers()['content-type']}`);
  const missing = await page.evaluate(() => ['#prompt', '#kv-a', '#kv-b', '#max-tokens', '#api-key', '#run', '#pane-a',
    '#pane-b', '#pane-a .out', '#pane-a .stats', '#pane-b .out', '#pane-b .stats'].filter((s) => !document.querySelector(s)));
  check(missing.length === 0, 'the page has #prompt, #kv-a, #kv-b, #max-tokens, #api-key, #run, two panes with .out and .stats',
        `missing ${missing.join(', ')}`);
  let st = await panes();
  check(st.every((p) => p.state === 'idle'), `panes idle before a run (${st.map((p) => p.state).join(', ')})`);
  const presets = await page.$eval('#kv-a', (i) => (i.list ? [...i.list.options].map((o) => o.value) : []));
  check(presets.includes('full') && presets.some((p) => p.startsWith('snapkv')) && presets.some((p) => p.startsWith('nacl')),
        `#kv-a presets: ${presets.join(', ')}`);

  await setValue('#prompt', '');
  await page.type('#prompt', prompt);
  await setValue('#kv-a', 'full');
  await setValue('#kv-b', 'nacl:budget=0.5');
  await setValue('#max-tokens', '48');
  if (await page.$('#kv-type')) await page.select('#kv-type', 'f16');
  const t0 = Date.now();
  await page.click('#run');
  // Both requests go out before either is answered: both panes leave "idle" at once.
  await page.waitForFunction(() => ['#pane-a', '#pane-b'].every((s) => document.querySelector(s).dataset.state !== 'idle'),
                             { timeout: 5000 });
  try { await settle(); } catch (e) { fail(`the panes did not finish within 30 s: ${e.message}`); }
  const ms = Date.now() - t0;
  st = await panes();
  const specs = ['full', 'nacl:budget=0.5'];
  st.forEach((p, i) => {
    const id = i ? '#pane-b' : '#pane-a';
    check(p.state === 'done', `${id} (${specs[i]}): data-state ${p.state} after ${ms} ms`, p.out.slice(0, 300));
    check(p.out.trim().length > 0, `${id} .out, the generated text: ${short(p.out.trim().replace(/\s+/g, ' '))}`);
    check(/\d+ tokens/.test(p.stats) && /tok\/s/.test(p.stats) && /KV bytes held/.test(p.stats) && /full F16/.test(p.stats),
          `${id} .stats: ${p.stats.replace(/\s+/g, ' ')}`);
    check(p.head.includes(specs[i]), `${id} heading names ${specs[i]}: ${p.head.replace(/\s+/g, ' ')}`);
  });
  const pct = st.map((p) => Number((p.stats.match(/\((\d+)%\)/) || [])[1]));
  check(pct[1] < pct[0] && pct[1] < 100, `KV held vs the full F16 cache: A ${pct[0]}%, B ${pct[1]}%`);
  const posts = requests.filter((u) => u.endsWith('/v1/completions')).length;
  check(posts === 2, `the page sent ${posts} requests to /v1/completions`);
  const foreign = requests.filter((u) => !u.startsWith(url) && !u.startsWith('data:'));
  check(foreign.length === 0, 'nothing requested from elsewhere', foreign.join(', '));
  check(errors.length === 0, 'no console errors', errors.join(' | '));
  if (shot) { await page.screenshot({ path: shot, fullPage: true }); ok(`screenshot ${shot}`); }

  // A server error lands in its pane; the other pane completes.
  await setValue('#kv-b', 'nosuchpolicy:budget=0.5');
  await run();
  st = await panes();
  check(st[1].state === 'error' && /400/.test(st[1].out) && /snapkv/.test(st[1].out),
        `bad policy: #pane-b data-state ${st[1].state}, shows ${short(st[1].out)}`);
  check(st[0].state === 'done', `the other pane completes (${st[0].state})`);
  await page.close();
}

async function withKey(browser) {
  const { page, setValue, panes, run } = await openPage(browser, keyedUrl);
  await setValue('#max-tokens', '8');
  await setValue('#api-key', key);
  await run();
  let st = await panes();
  check(st.every((p) => p.state === 'done'), '--api-key, the key typed: both panes done', JSON.stringify(st));
  await setValue('#api-key', '');
  await run();
  st = await panes();
  check(st.every((p) => p.state === 'error' && /401/.test(p.out)), `--api-key, no key typed: both panes show ${short(st[0].out)}`,
        JSON.stringify(st));
  await page.close();
}

async function main() {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'],
    headless: true,
    timeout: 60000,
  });
  try {
    await withoutKey(browser);
    if (keyedUrl) await withKey(browser);
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.log(`FAIL: unexpected error: ${e?.constructor?.name} ${e?.message}`);
  process.exit(1);
});
