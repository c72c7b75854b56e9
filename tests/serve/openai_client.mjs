// The official openai npm client against a running `kvslim serve` (tests/cli/serve_openai.sh).
// env: SERVE_URL (http://HOST:PORT), SERVE_KEY (the server's --api-key), SERVE_MODEL_ID (the
// model file's basename). Prints one `ok: ...` or `FAIL: ...` line per check; exits 1 on a crash.
import OpenAI from 'openai';

const url = process.env.SERVE_URL, key = process.env.SERVE_KEY, modelId = process.env.SERVE_MODEL_ID;
const client = new OpenAI({ apiKey: key, baseURL: `${url}/v1`, maxRetries: 0, timeout: 30000 });
const ok = (what) => console.log(`ok: ${what}`);
const fail = (what) => console.log(`FAIL: ${what}`);
const check = (cond, what, detail = '') => (cond ? ok(what) : fail(detail ? `${what}: ${detail}` : what));
const short = (s) => JSON.stringify(s.length > 60 ? s.slice(0, 60) + '...' : s);
// A prompt of a few hundred tokens, so that a budget of a fraction of it compresses.
const longPrompt = 'Once upon a time, there was a little girl named Lily. She liked to play outside with her dog. '
  .repeat(8) + 'One day,';

// usage is consistent: total = prompt + completion, KV bytes reported.
function checkUsage(what, r, maxTokens) {
  const u = r.usage ?? {};
  check(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0 && Number.isInteger(u.completion_tokens)
        && u.total_tokens === u.prompt_tokens + u.completion_tokens,
        `${what}: usage total ${u.total_tokens} = prompt ${u.prompt_tokens} + completion ${u.completion_tokens}`,
        JSON.stringify(u));
  const fin = r.choices?.[0]?.finish_reason;
  check(fin === 'stop' || (fin === 'length' && u.completion_tokens === maxTokens),
        `${what}: finish_reason ${fin} with ${u.completion_tokens} of ${maxTokens} tokens`);
  check(u.kv_bytes > 0 && u.kv_bytes_full_f16 > 0, `${what}: kv_bytes ${u.kv_bytes}, kv_bytes_full_f16 ${u.kv_bytes_full_f16}`,
        JSON.stringify(u));
  return u;
}

// Streams a completion; returns the concatenated text, the chunk count and the last chunk.
async function streamCompletion(params) {
  const stream = await client.completions.create({ ...params, stream: true });
  let text = '', chunks = 0, last = null;
  for await (const c of stream) { chunks++; text += c.choices?.[0]?.text ?? ''; last = c; }
  return { text, chunks, last };
}
async function streamChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = '', chunks = 0, last = null, role = null;
  for await (const c of stream) {
    chunks++; last = c;
    const d = c.choices?.[0]?.delta ?? {};
    if (d.role) role = role ?? d.role;
    text += d.content ?? '';
    if (c.object !== 'chat.completion.chunk') fail(`chat chunk object ${c.object}`);
  }
  return { text, chunks, last, role };
}

async function main() {
  // models.list
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  check(models.length === 1 && models[0].id === modelId && models[0].owned_by === 'kvslim'
        && models[0].object === 'model', `models.list: ${models.map((m) => m.id).join(', ')}`,
        JSON.stringify(models));

  // Completions, greedy, not streamed then streamed: the same text.
  const base = { model: modelId, prompt: 'Once upon a time', max_tokens: 40, temperature: 0, seed: 7 };
  const r = await client.completions.create(base);
  const text = r.choices?.[0]?.text ?? '';
  check(r.object === 'text_completion' && r.model === modelId && /^cmpl-/.test(r.id),
        `completion: object ${r.object}, model ${r.model}, id ${r.id}`);
  check(text.length > 0, `completion text non-empty: ${short(text)}`);
  checkUsage('completion', r, 40);
  check(r.kv === 'full', `completion without kv: kv "${r.kv}", kv_type "${r.kv_type}"`);
  const s = await streamCompletion(base);
  check(s.text === text && s.chunks > 2, `streamed completion (${s.chunks} chunks) equals the non-streamed text`,
        `${short(s.text)} vs ${short(text)}`);
  check(s.last?.choices?.[0]?.finish_reason === r.choices[0].finish_reason
        && s.last?.usage?.total_tokens === r.usage.total_tokens,
        `streamed last chunk: finish_reason ${s.last?.choices?.[0]?.finish_reason}, usage ${JSON.stringify(s.last?.usage)}`);

  // Sampled with a seed: the stream and the plain response draw the same tokens.
  const sampled = { ...base, temperature: 0.8, top_p: 0.95, seed: 1234 };
  const rs = await client.completions.create(sampled);
  const ss = await streamCompletion(sampled);
  check(rs.choices[0].text === ss.text && ss.text.length > 0,
        `temperature 0.8, seed 1234: streamed equals non-streamed (${short(ss.text)})`,
        `${short(ss.text)} vs ${short(rs.choices[0].text)}`);

  // Stop strings: cut the greedy text at a word of it, which is not included.
  const words = text.split(/\s+/).filter((w) => w.length >= 3);
  const stopWord = words.find((w) => text.indexOf(w) >= 8) ?? '.';
  const cut = text.slice(0, text.indexOf(stopWord));
  const rstop = await client.completions.create({ ...base, stop: [stopWord, '@@never@@'] });
  check(rstop.choices[0].text === cut && rstop.choices[0].finish_reason === 'stop',
        `stop ${JSON.stringify(stopWord)}: text ${short(rstop.choices[0].text)}, finish_reason ${rstop.choices[0].finish_reason}`,
        `expected ${short(cut)}`);
  const sstop = await streamCompletion({ ...base, stop: stopWord });
  check(sstop.text === cut && sstop.last?.choices?.[0]?.finish_reason === 'stop',
        `streamed with stop ${JSON.stringify(stopWord)}: the same cut text`, `${short(sstop.text)} vs ${short(cut)}`);

  // KV policies on a longer prompt: compressing ones hold fewer bytes than the full F16 cache.
  const full = await client.completions.create({ ...base, prompt: longPrompt, max_tokens: 16, kv: 'full', kv_type: 'f16' });
  const fu = checkUsage('full/f16, long prompt', full, 16);
  for (const kv of ['nacl:budget=0.5', 'snapkv:budget=0.2', 'streaming:budget=0.25']) {
    const c = await client.completions.create({ ...base, prompt: longPrompt, max_tokens: 16, kv, kv_type: 'f16' });
    const u = checkUsage(kv, c, 16);
    check(c.kv === kv && c.kv_type === 'f16' && (c.choices[0].text ?? '').length > 0,
          `${kv}: kv echoed "${c.kv}", kv_type "${c.kv_type}", text ${short(c.choices[0].text ?? '')}`);
    check(u.prompt_tokens === fu.prompt_tokens, `${kv}: the same ${u.prompt_tokens} prompt tokens as the full cache`,
          JSON.stringify(u));
    check(u.kv_bytes > 0 && u.kv_bytes <= u.kv_bytes_full_f16 && u.kv_bytes < fu.kv_bytes,
          `${kv} (f16): KV ${u.kv_bytes} bytes <= full F16 ${u.kv_bytes_full_f16}, < the full cache's ${fu.kv_bytes}`);
  }
  const sk = await streamCompletion({ ...base, prompt: longPrompt, max_tokens: 16, kv: 'snapkv:budget=0.2' });
  check(sk.last?.kv === 'snapkv:budget=0.2' && sk.last?.usage?.kv_bytes > 0 && sk.last.usage.kv_bytes <= sk.last.usage.kv_bytes_full_f16,
        `streamed snapkv: last chunk kv "${sk.last?.kv}", usage ${JSON.stringify(sk.last?.usage)}`);

  // Chat completions.
  const messages = [{ role: 'system', content: 'You tell short stories.' },
                    { role: 'user', content: 'Tell me a story about a cat.' }];
  const chat = { model: modelId, messages, max_tokens: 32, temperature: 0, seed: 3 };
  const c = await client.chat.completions.create(chat);
  const content = c.choices?.[0]?.message?.content ?? '';
  check(c.object === 'chat.completion' && c.choices[0].message.role === 'assistant' && content.length > 0,
        `chat completion: ${c.object}, role ${c.choices?.[0]?.message?.role}, content ${short(content)}`);
  checkUsage('chat completion', c, 32);
  const sc = await streamChat(chat);
  check(sc.role === 'assistant' && sc.text === content, `streamed chat (${sc.chunks} chunks): role ${sc.role}, same content`,
        `${short(sc.text)} vs ${short(content)}`);
  check(sc.last?.choices?.[0]?.finish_reason === c.choices[0].finish_reason && sc.last?.usage?.total_tokens === c.usage.total_tokens,
        `streamed chat last chunk: finish_reason ${sc.last?.choices?.[0]?.finish_reason}, usage ${JSON.stringify(sc.last?.usage)}`);
  const ckv = await client.chat.completions.create({ ...chat, messages: [{ role: 'user', content: longPrompt }],
                                                     kv: 'snapkv:budget=0.2', kv_type: 'f16' });
  const cu = checkUsage('chat, snapkv:budget=0.2 f16', ckv, 32);
  check(ckv.kv === 'snapkv:budget=0.2' && ckv.kv_type === 'f16' && cu.kv_bytes <= cu.kv_bytes_full_f16,
        `chat snapkv/f16: KV ${cu.kv_bytes} <= full F16 ${cu.kv_bytes_full_f16}`);

  // Errors come back as the client's typed errors.
  try {
    await client.completions.create({ ...base, kv: 'nosuchpolicy:budget=0.5' });
    fail('bad kv: accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 && /snapkv/.test(e.message) && /streaming/.test(e.message),
          `bad kv: BadRequestError 400 listing the policies: ${short(e.message)}`, `${e.constructor.name} ${e.status} ${e.message}`);
  }
  const wrong = new OpenAI({ apiKey: 'not-the-key', baseURL: `${url}/v1`, maxRetries: 0, timeout: 30000 });
  for (const [what, call] of [['models.list', () => wrong.models.list()],
                              ['completions.create', () => wrong.completions.create(base)]]) {
    try {
      await call();
      fail(`wrong key, ${what}: accepted`);
    } catch (e) {
      check(e instanceof OpenAI.AuthenticationError && e.status === 401,
            `wrong key, ${what}: AuthenticationError ${e.status}`, `${e.constructor.name} ${e.status} ${e.message}`);
    }
  }
}

main().catch((e) => {
  console.log(`FAIL: unexpected error: ${e?.constructor?.name} ${e?.status ?? ''} ${e?.message}`);
  process.exit(1);
});
