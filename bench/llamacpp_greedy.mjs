// Greedy tokens from llama.cpp (node-llama-cpp's prebuilt CPU build) for GGUF files and prompt ids:
//   node bench/llamacpp_greedy.mjs MODEL.gguf 814,26 64 [MODEL2.gguf IDS N ...]
// prints one line per (model, ids, n) triple, in order: {"engine": ..., "model": ..., "prompt_ids": [...],
// "generated_ids": [...]}. Several triples share one process (node and the llama.cpp binding start once, ~2 s).
// Used by tests/test_llamacpp_peer.cpp to check that our GGUF files load in llama.cpp and decode to our tokens.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import path from "node:path";

const args = process.argv.slice(2);
if (args.length !== 2 && (args.length === 0 || args.length % 3 !== 0)) {
    process.stderr.write("usage: node bench/llamacpp_greedy.mjs MODEL.gguf ID,ID,... [N] [MODEL ID,... N ...]\n");
    process.exit(2);
}
const jobs = [];
for (let i = 0; i < args.length; i += 3)
    jobs.push({ modelPath: args[i], promptIds: args[i + 1].split(",").map(Number), nGen: Number(args[i + 2] ?? 64) });

// One llama.cpp thread: these models are tiny, and llama.cpp's workers spin-wait between the ops of a step,
// which on a busy 2-core machine (ctest -j2) cost ~0.4 CPU s per token with two threads against ~0.02 with one
// (the same tokens).
const llama = await getLlama({ gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
                               logLevel: LlamaLogLevel.error, progressLogs: false });
for (const { modelPath, promptIds, nGen } of jobs) {
    const model = await llama.loadModel({ modelPath: path.resolve(modelPath), gpuLayers: 0 });
    const context = await model.createContext({ contextSize: promptIds.length + nGen + 1, batchSize: 64,
                                                threads: 1, sequences: 1 });
    const sequence = context.getSequence();
    const out = [];
    const iter = sequence.evaluate(promptIds, { temperature: 0, yieldEogToken: true });
    for (let r = await iter.next(); !r.done && out.length < nGen; r = await iter.next()) out.push(r.value);
    await iter.return();
    process.stdout.write(JSON.stringify({ engine: "llama.cpp (node-llama-cpp)", model: modelPath,
                                          prompt_ids: promptIds, generated_ids: out }) + "\n");
    await context.dispose();
    await model.dispose();
}
