#!/usr/bin/env node
// Peer benchmark: llama.cpp (through node-llama-cpp's prebuilt CPU binaries) on a GGUF file.
//
//   node bench/llamacpp_peer.mjs --model /tmp/ultra-bench/llama110m-q8_0.gguf --threads 2 --prompt 128 --gen 128 --reps 3
//
// Per rep: a fresh context sequence (empty KV cache); a fixed prompt of --prompt token ids
// ((i*7919) % (n_vocab-300) + 300, no tokenizer) is evaluated in one batch and the first token
// is sampled greedily: that is the prefill (pp) time.  Then --gen more tokens are decoded one at
// a time, greedy (temperature 0), EOS ignored: that is the decode (tg) time.  So the context ends
// at prompt+gen tokens, pp_tps = prompt / pp_seconds, tg_tps = gen / tg_seconds.
// Wall-clock times include node-llama-cpp's JS/N-API overhead per step; llama.cpp's own
// counters (llama_perf_context) are reported next to them as *_llama_ms for comparison.
// The JSON result goes to stdout; everything else (llama.cpp logs with --verbose) to stderr.

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { performance } from "node:perf_hooks";
import path from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function usage(msg) {
    if (msg) process.stderr.write(`llamacpp_peer: ${msg}\n`);
    process.stderr.write(
        "usage: node bench/llamacpp_peer.mjs --model PATH [--threads 2] [--prompt 128] [--gen 128] [--reps 3]\n" +
        "       [--warmup 1] [--flash-attn auto|on|off] [--mmap auto|on|off] [--verbose]\n");
    process.exit(2);
}

let opts;
try {
    ({ values: opts } = parseArgs({
        options: {
            model: { type: "string" },
            threads: { type: "string", default: "2" },
            prompt: { type: "string", default: "128" },
            gen: { type: "string", default: "128" },
            reps: { type: "string", default: "3" },
            warmup: { type: "string", default: "1" },
            "flash-attn": { type: "string", default: "auto" },
            mmap: { type: "string", default: "auto" },
            verbose: { type: "boolean", default: false },
            help: { type: "boolean", short: "h", default: false }
        },
        strict: true
    }));
} catch (e) {
    usage(e.message);
}
if (opts.help) usage();
if (!opts.model) usage("--model is required");

const intOpt = (name, min) => {
    const v = Number(opts[name]);
    if (!Number.isInteger(v) || v < min) usage(`--${name} must be an integer >= ${min}`);
    return v;
};
const threads = intOpt("threads", 1);
const nPrompt = intOpt("prompt", 1);
const nGen = intOpt("gen", 1);
const reps = intOpt("reps", 1);
const warmup = intOpt("warmup", 0);
const triState = (name) => {
    const v = opts[name];
    if (v === "auto") return "auto";
    if (v === "on" || v === "1" || v === "true") return true;
    if (v === "off" || v === "0" || v === "false") return false;
    usage(`--${name} must be auto, on or off`);
};
const flashAttention = triState("flash-attn");
const useMmap = triState("mmap");

// node-llama-cpp's "exports" hide package.json: find it next to the resolved entry point (dist/index.js).
const nlcVersion = JSON.parse(readFileSync(
    path.join(path.dirname(fileURLToPath(import.meta.resolve("node-llama-cpp"))), "..", "package.json"), "utf8")).version;

// ---- llama.cpp log capture: keep everything, echo with --verbose, parse llama_perf lines ----
const logLines = [];
const logger = (level, message) => {
    logLines.push(message);
    if (opts.verbose || level === LlamaLogLevel.error || level === LlamaLogLevel.fatal)
        process.stderr.write(`[llama.cpp ${level}] ${message}${message.endsWith("\n") ? "" : "\n"}`);
};

const llama = await getLlama({
    gpu: false,                 // CPU backend only
    build: "never",             // never compile llama.cpp from source: use the prebuilt binary or fail
    skipDownload: true,         // never fetch llama.cpp sources from GitHub
    usePrebuiltBinaries: true,
    maxThreads: 0,              // no global cap: the context's `threads` is then the exact count used
    logLevel: LlamaLogLevel.info, // needed to receive llama_perf_context_print output
    logger,
    progressLogs: false
});
if (llama.gpu !== false) throw new Error(`expected the CPU backend, got gpu=${llama.gpu}`);

const tLoad0 = performance.now();
const model = await llama.loadModel({
    modelPath: path.resolve(opts.model),
    gpuLayers: 0,
    useMmap,
    useMlock: false
});
const loadMs = performance.now() - tLoad0;

// n_vocab from the tensor shape (token_embd.weight is [n_embd, n_vocab] in ggml order).
let nVocab;
const embd = model.fileInfo.tensorInfo?.find((t) => t.name === "token_embd.weight");
if (embd) nVocab = Number(embd.dimensions[1]);
else nVocab = Number(model.fileInfo.metadata?.llama?.vocab_size);
if (!(nVocab > 300)) throw new Error(`cannot determine n_vocab (got ${nVocab})`);

const promptTokens = Array.from({ length: nPrompt }, (_, i) => ((i * 7919) % (nVocab - 300)) + 300);

const context = await model.createContext({
    // node-llama-cpp keeps one cell free (it context-shifts when contextSize - 1 - nextTokenIndex
    // runs out), hence the +1; llama.cpp then rounds the size up to a multiple of 256.
    contextSize: nPrompt + nGen + 1,
    batchSize: nPrompt,            // the whole prompt in one llama_decode call
    threads,
    flashAttention: flashAttention === "auto" ? undefined : flashAttention,
    sequences: 1,
    performanceTracking: true,     // enables llama_perf_context counters (printTimings)
    failedCreationRemedy: false
});
if (context.contextSize < nPrompt + nGen + 1) throw new Error(`context too small: ${context.contextSize}`);
if (context.batchSize < nPrompt) throw new Error(`batch too small: ${context.batchSize}`);

// llama_perf_context_print lines, e.g.
//   "llama_perf_context_print: prompt eval time =      12.34 ms /   128 tokens (...)"
//   "llama_perf_context_print:        eval time =      56.78 ms /   127 runs   (...)"
async function readLlamaPerf() {
    const start = logLines.length;
    await context.printTimings(); // prints, then resets the counters
    await new Promise((r) => setTimeout(r, 20)); // logs arrive through a thread-safe callback
    const text = logLines.slice(start).join("\n");
    const grab = (re) => {
        const m = text.match(re);
        return m ? { ms: Number(m[1]), n: Number(m[2]) } : null;
    };
    return {
        prompt: grab(/prompt eval time\s*=\s*([\d.]+)\s*ms\s*\/\s*(\d+)\s*tokens/),
        eval: grab(/[^t]\s+eval time\s*=\s*([\d.]+)\s*ms\s*\/\s*(\d+)\s*runs/)
    };
}

// One measured run on a fresh sequence.  Returns wall-clock ms for prefill and decode.
async function runOnce(np, ng) {
    const sequence = context.getSequence();
    try {
        if (sequence.nextTokenIndex !== 0) throw new Error("sequence is not empty");
        const tokens = promptTokens.slice(0, np);
        const iter = sequence.evaluate(tokens, {
            temperature: 0,        // greedy sampler
            yieldEogToken: true    // do not stop on EOS: keep decoding
        });
        const t0 = performance.now();
        let r = await iter.next();      // prompt decode (one batch) + first sampled token
        const t1 = performance.now();
        if (r.done) throw new Error("generation ended after the prompt");
        let generated = 0;
        while (generated < ng) {        // each step: decode the previous token, sample the next
            r = await iter.next();
            if (r.done) throw new Error(`generation ended early after ${generated} tokens`);
            generated++;
        }
        const t2 = performance.now();
        await iter.return();
        const nCtx = sequence.nextTokenIndex;
        if (nCtx !== np + ng) throw new Error(`unexpected context length ${nCtx} (expected ${np + ng})`);
        return { ppMs: t1 - t0, tgMs: t2 - t1, lastToken: r.value };
    } finally {
        await sequence.dispose();   // frees the sequence and its KV cells for the next rep
    }
}

for (let i = 0; i < warmup; i++) {
    await runOnce(Math.min(nPrompt, 16), Math.min(nGen, 8)); // page in the weights, warm caches
}
await readLlamaPerf(); // reset counters after warmup

const pp = [], tg = [], ppLlama = [], tgLlama = [];
for (let i = 0; i < reps; i++) {
    const { ppMs, tgMs } = await runOnce(nPrompt, nGen);
    const perf = await readLlamaPerf();
    pp.push(nPrompt / (ppMs / 1000));
    tg.push(nGen / (tgMs / 1000));
    ppLlama.push(perf.prompt ? { ms: perf.prompt.ms, tokens: perf.prompt.n } : null);
    tgLlama.push(perf.eval ? { ms: perf.eval.ms, runs: perf.eval.n } : null);
    if (opts.verbose)
        process.stderr.write(`rep ${i}: pp ${ppMs.toFixed(1)} ms, tg ${tgMs.toFixed(1)} ms; ` +
            `llama.cpp: ${JSON.stringify(perf)}\n`);
}

const mean = (a) => a.reduce((s, x) => s + x, 0) / a.length;
const round = (x, d = 2) => Math.round(x * 10 ** d) / 10 ** d;
// Which CPU-feature variant of the ggml CPU backend the loader picked (libggml-cpu-<variant>.so).
// And which native addon file is actually mapped (proves the npm prebuilt binary is in use).
let cpuVariant = null, addonPath = null;
try {
    const maps = readFileSync("/proc/self/maps", "utf8");
    cpuVariant = maps.match(/libggml-cpu-([\w.]+)\.so/)?.[1] ?? null;
    addonPath = maps.match(/(\/\S*llama-addon\.node)/)?.[1] ?? null;
    if (addonPath) addonPath = path.relative(process.cwd(), addonPath);
} catch { /* not Linux */ }
const median = (a) => {
    const b = [...a].sort((x, y) => x - y), m = b.length >> 1;
    return b.length % 2 ? b[m] : (b[m - 1] + b[m]) / 2;
};

const result = {
    engine: `llama.cpp (node-llama-cpp ${nlcVersion})`,
    model: path.resolve(opts.model),
    threads,
    prompt_tokens: nPrompt,
    gen_tokens: nGen,
    pp_tps: pp.map((x) => round(x)),
    tg_tps: tg.map((x) => round(x)),
    pp_tps_mean: round(mean(pp)),
    tg_tps_mean: round(mean(tg)),
    load_ms: round(loadMs, 1),
    pp_tps_median: round(median(pp)),
    tg_tps_median: round(median(tg)),
    // extra detail
    reps,
    warmup_runs: warmup,
    llama_cpp_release: `${llama.llamaCppRelease.repo}@${llama.llamaCppRelease.release}`,
    binary: llama.buildType,               // "prebuilt" = the npm @node-llama-cpp/linux-x64 binary
    binary_path: addonPath,
    cpu_backend_variant: cpuVariant,
    threads_used: context.currentThreads,
    context_size: context.contextSize,
    batch_size: context.batchSize,
    flash_attention: context.flashAttention,
    use_mmap: model.useMmap,
    n_vocab: nVocab,
    // llama.cpp's own timers (llama_perf_context) per rep: prompt batch decode and the single-token
    // decodes (it counts gen_tokens runs: the first token comes from the prompt batch).
    // The same throughputs computed from llama.cpp's own timers: pure llama_decode time, without
    // node-llama-cpp's per-step JS/N-API/thread hand-off overhead and without sampling
    // (comparable to llama-bench's pp/tg numbers).
    pp_tps_llama: ppLlama.map((x) => x && round(x.tokens / (x.ms / 1000))),
    tg_tps_llama: tgLlama.map((x) => x && round(x.runs / (x.ms / 1000))),
    pp_tps_llama_mean: ppLlama.every(Boolean) ? round(mean(ppLlama.map((x) => x.tokens / (x.ms / 1000)))) : null,
    tg_tps_llama_mean: tgLlama.every(Boolean) ? round(mean(tgLlama.map((x) => x.runs / (x.ms / 1000)))) : null,
    pp_llama_ms: ppLlama.map((x) => x && round(x.ms)),
    tg_llama_ms: tgLlama.map((x) => x && round(x.ms)),
    tg_llama_runs: tgLlama.map((x) => x && x.runs),
    system_info: llama.systemInfo
};
process.stdout.write(JSON.stringify(result) + "\n");

await context.dispose();
await model.dispose();
await llama.dispose();
