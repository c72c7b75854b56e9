#!/usr/bin/env node
// Times llama.cpp on a GGUF file through node-llama-cpp's prebuilt CPU binaries, the same way
// `kvslim bench` times kvslim: a prompt of random token ids in one evaluation (prefill), then
// single-token decode steps fed from a fixed random token list (no logits, no sampling).
//
//   node llamacpp_bench.mjs -m MODEL [-p N_PROMPT] [-n N_GEN] [-t THREADS] [-r REPS]
//                           [--seed S] [--json OUT] [--node-modules DIR] [-v]
//
// Timing: prefill_tok_s and decode_tok_s come from llama.cpp's own performance counters
// (llama_perf_context: from the start of llama_decode to llama_synchronize), i.e. pure
// llama_decode time as llama-bench would see it. The wall-clock numbers seen from JavaScript
// (which add node-llama-cpp's batch scheduling and the libuv worker round trip) are reported
// too, as *_wall, with the difference per decode step as js_overhead_us_per_step.
//
// Never builds llama.cpp and never downloads anything: getLlama({gpu: false, build: "never",
// skipDownload: true}) only loads the prebuilt binaries of @node-llama-cpp/linux-x64.
// The KV cache uses llama.cpp's default type (F16); flash attention is llama.cpp's default
// ("auto"), and what it resolved to is reported.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const usage = `usage: node llamacpp_bench.mjs -m MODEL [options]
  -m, --model MODEL     GGUF model
  -p, --n-prompt N      prompt tokens, evaluated in one batch (default 512)
  -n, --n-gen N         single-token decode steps (default 128)
  -t, --threads N       threads (default 2)
  -r, --reps N          repetitions, reported as mean of tok/s (default 1)
  --seed S              seed of the random token ids (default 7)
  --json FILE           also write the JSON result to FILE
  --node-modules DIR    node_modules directory holding node-llama-cpp (default: normal
                        resolution from this script's directory)
  -v, --verbose         print llama.cpp's log to stderr
`;

function die(msg) {
    process.stderr.write(`llamacpp_bench: ${msg}\n`);
    process.exit(2);
}

function parseArgs(argv) {
    const o = { model: null, nPrompt: 512, nGen: 128, threads: 2, reps: 1, seed: 7, json: null,
                nodeModules: process.env.LLAMACPP_BENCH_NODE_MODULES || null, verbose: false };
    const int = (flag, v, min) => {
        const n = Number(v);
        if (v === undefined || !Number.isInteger(n) || n < min)
            die(`${flag} needs an integer >= ${min}`);
        return n;
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i], next = () => argv[++i];
        switch (a) {
        case "-h": case "--help": process.stdout.write(usage); process.exit(0);
        case "-m": case "--model": o.model = next(); break;
        case "-p": case "--n-prompt": o.nPrompt = int(a, next(), 1); break;
        case "-n": case "--n-gen": o.nGen = int(a, next(), 0); break;
        case "-t": case "--threads": o.threads = int(a, next(), 1); break;
        case "-r": case "--reps": o.reps = int(a, next(), 1); break;
        case "--seed": o.seed = int(a, next(), 0); break;
        case "--json": o.json = next(); break;
        case "--node-modules": o.nodeModules = next(); break;
        case "-v": case "--verbose": o.verbose = true; break;
        default: die(`unknown argument '${a}' (see --help)`);
        }
    }
    if (!o.model) die("needs -m MODEL (see --help)");
    if (!fs.existsSync(o.model)) die(`no such model file: ${o.model}`);
    return o;
}

async function importNodeLlamaCpp(nodeModules) {
    if (!nodeModules) return await import("node-llama-cpp");
    const pkgDir = path.resolve(nodeModules, "node-llama-cpp");
    const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
    const exp = pkg.exports?.["."];
    const entry = (typeof exp === "string" ? exp : exp?.import ?? exp?.default) ?? pkg.main;
    return await import(pathToFileURL(path.join(pkgDir, entry)).href);
}

// The LCG of kvslim's bench (tools/cmd_bench.c), so both engines see similar token streams.
function makeTokens(count, nVocab, exclude, seed) {
    let state = seed >>> 0;
    const out = [];
    while (out.length < count) {
        state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
        const t = (state >>> 8) % nVocab;
        if (!exclude.has(t)) out.push(t);
    }
    return out;
}

const now = () => performance.now(); // ms

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const nlc = await importNodeLlamaCpp(o.nodeModules);
    const { getLlama, LlamaLogLevel } = nlc;

    // llama.cpp's log: kept in memory (printed with -v), parsed for the perf counters.
    let logText = "";
    const logger = (level, message) => {
        logText += message;
        if (o.verbose) process.stderr.write(`[${level}] ${message}`);
    };
    const llama = await getLlama({
        gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
        progressLogs: false, maxThreads: 0, logLevel: LlamaLogLevel.info, logger,
    });
    if (llama.gpu !== false) die(`expected a CPU-only llama, got gpu=${llama.gpu}`);

    const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
    const ctxTokens = o.nPrompt + Math.max(o.nGen, 1) + 8;
    const context = await model.createContext({
        contextSize: ctxTokens,
        batchSize: o.nPrompt,          // n_batch = n_ubatch = N_PROMPT: the prompt is one ubatch
        threads: o.threads,
        sequences: 1,
        performanceTracking: true,     // llama_perf counters on (no_perf = false)
        failedCreationRemedy: false,
        ignoreMemorySafetyChecks: true,
    });
    if (context.batchSize < o.nPrompt)
        die(`batch size ${context.batchSize} < n_prompt ${o.nPrompt}`);
    const sequence = context.getSequence();

    // Which ggml CPU backend variant the dynamic loader picked (libggml-cpu-<variant>.so).
    const maps = fs.readFileSync("/proc/self/maps", "utf8");
    const cpuLibs = [...new Set([...maps.matchAll(/\/(libggml-cpu-[\w.-]+\.so)\b/g)].map((m) => m[1]))];
    const backend = cpuLibs.map((l) => l.replace(/^libggml-cpu-/, "").replace(/\.so$/, "")).join(",");

    const vocabSize = model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length ??
        model.fileInfo?.tensorInfo?.find((t) => t.name === "token_embd.weight")?.dimensions?.[1];
    if (!vocabSize) die("could not read the vocabulary size");
    const exclude = new Set([model.tokens.bos, model.tokens.eos, model.tokens.eot]
        .filter((t) => t != null && t >= 0));
    const tokens = makeTokens(o.nPrompt + o.nGen, vocabSize, exclude, o.seed);
    const prompt = tokens.slice(0, o.nPrompt), gen = tokens.slice(o.nPrompt);

    // Reads llama_perf_context_print's lines (printTimings prints and then resets the counters).
    async function perfCounters() {
        const start = logText.length;
        await context.printTimings();
        for (let i = 0; i < 50 && !/total time/.test(logText.slice(start)); i++)
            await new Promise((r) => setTimeout(r, 2));
        const text = logText.slice(start);
        const num = (re) => { const m = text.match(re); return m ? [Number(m[1]), Number(m[2])] : null; };
        return {
            prompt: num(/prompt eval time\s*=\s*([\d.]+) ms\s*\/\s*(\d+) tokens/),
            eval: num(/eval time\s*=\s*([\d.]+) ms\s*\/\s*(\d+) runs/),
        };
    }

    // Warm-up once (as kvslim does): page in the weights, build the graphs of both shapes.
    await sequence.evaluateWithoutGeneratingNewTokens(prompt.slice(0, Math.min(32, o.nPrompt)));
    for (let i = 0; i < Math.min(2, o.nGen); i++)
        await sequence.evaluateWithoutGeneratingNewTokens([gen[i]]);
    await sequence.clearHistory();
    await perfCounters();

    const runs = [];
    for (let r = 0; r < o.reps; r++) {
        await sequence.clearHistory();
        await perfCounters(); // reset
        process.stderr.write(`llama.cpp: rep ${r + 1}/${o.reps}: prefill ${o.nPrompt} ...\n`);
        const t0 = now();
        await sequence.evaluateWithoutGeneratingNewTokens(prompt);
        const t1 = now();
        for (let g = 0; g < o.nGen; g++)
            await sequence.evaluateWithoutGeneratingNewTokens([gen[g]]);
        const t2 = now();
        const perf = await perfCounters();
        if (sequence.nextTokenIndex !== o.nPrompt + o.nGen)
            die(`sequence holds ${sequence.nextTokenIndex} tokens, expected ${o.nPrompt + o.nGen}`);
        const ok = perf.prompt && perf.prompt[1] === o.nPrompt &&
            (o.nGen === 0 || (perf.eval && perf.eval[1] === o.nGen));
        if (!ok)
            process.stderr.write("llama.cpp: could not read llama_perf counters; using wall-clock times\n");
        runs.push({
            prefill_ms_wall: t1 - t0, decode_ms_wall: t2 - t1,
            prefill_ms: ok ? perf.prompt[0] : t1 - t0,
            decode_ms: ok && o.nGen ? perf.eval[0] : t2 - t1,
            timing: ok ? "llama_perf" : "wall",
        });
    }
    const mean = (f) => runs.reduce((s, r) => s + f(r), 0) / runs.length;
    const kv = logText.match(/llama_kv_cache: size =\s*([\d.]+) MiB\s*\(\s*(\d+) cells[^\n]*K \((\w+)\)[^\n]*V \((\w+)\)/);
    const flash = /Flash Attention enabled/.test(logText) ? true
        : /Flash Attention (was )?(auto, set to )?disabled/i.test(logText) ? false : null;
    const ggmlTypeName = (t) => (typeof t === "number" ? ({ 0: "f32", 1: "f16", 8: "q8_0", 2: "q4_0", 30: "bf16" })[t] ?? String(t) : String(t));
    let nlcVersion = null;
    try {
        const dir = o.nodeModules ? path.resolve(o.nodeModules, "node-llama-cpp")
            : path.dirname(path.dirname(new URL(import.meta.resolve("node-llama-cpp")).pathname));
        nlcVersion = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
    } catch { /* version is informational only */ }

    const js_overhead_us_per_step = o.nGen && runs.every((r) => r.timing === "llama_perf")
        ? mean((r) => (r.decode_ms_wall - r.decode_ms) * 1e3 / o.nGen) : null;
    const result = {
        engine: "llama.cpp",
        model: o.model,
        threads: context.currentThreads,
        n_prompt: o.nPrompt,
        n_gen: o.nGen,
        reps: o.reps,
        prefill_tok_s: mean((r) => o.nPrompt / (r.prefill_ms / 1e3)),
        decode_tok_s: o.nGen ? mean((r) => o.nGen / (r.decode_ms / 1e3)) : 0,
        timing: runs.every((r) => r.timing === "llama_perf") ? "llama_perf" : "wall",
        prefill_tok_s_wall: mean((r) => o.nPrompt / (r.prefill_ms_wall / 1e3)),
        decode_tok_s_wall: o.nGen ? mean((r) => o.nGen / (r.decode_ms_wall / 1e3)) : 0,
        js_overhead_us_per_step,
        batch_size: context.batchSize,
        context_size: context.contextSize,
        kv_type_k: kv ? kv[3] : ggmlTypeName(context.kvCacheKeyType),
        kv_type_v: kv ? kv[4] : ggmlTypeName(context.kvCacheValueType),
        kv_alloc_bytes: kv ? Math.round(Number(kv[1]) * 1024 * 1024) : null,
        kv_cells: kv ? Number(kv[2]) : null,
        flash_attn: flash,
        ggml_cpu_backend: backend || null,
        llama_cpp_release: llama.llamaCppRelease?.release ?? null,
        node_llama_cpp: nlcVersion,
        peak_rss_bytes: process.resourceUsage().maxRSS * 1024, // whole node process
    };
    if (result.threads !== o.threads)
        process.stderr.write(`llama.cpp: warning: context uses ${result.threads} threads, asked ${o.threads}\n`);
    const round3 = (k, v) => (typeof v === "number" && !Number.isInteger(v) ? Math.round(v * 1e3) / 1e3 : v);
    const json = JSON.stringify(result, round3) + "\n";
    process.stdout.write(json);
    if (o.json) fs.writeFileSync(o.json, json);

    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    process.stderr.write(`llamacpp_bench: ${e?.stack ?? e}\n`);
    process.exit(1);
});
