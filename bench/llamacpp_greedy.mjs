// Greedy tokens from llama.cpp (node-llama-cpp's prebuilt CPU build) for a GGUF file and prompt ids:
//   node bench/llamacpp_greedy.mjs MODEL.gguf 814,26 64
// prints {"engine": ..., "prompt_ids": [...], "generated_ids": [...]} on stdout. Used by
// tests/test_llamacpp_peer.cpp to check that our GGUF files load in llama.cpp and decode to our tokens.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import path from "node:path";

const [modelPath, idsArg, nArg] = process.argv.slice(2);
if (!modelPath || !idsArg) {
    process.stderr.write("usage: node bench/llamacpp_greedy.mjs MODEL.gguf ID,ID,... [N]\n");
    process.exit(2);
}
const promptIds = idsArg.split(",").map(Number);
const nGen = Number(nArg ?? 64);

const llama = await getLlama({ gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
                               logLevel: LlamaLogLevel.error, progressLogs: false });
const model = await llama.loadModel({ modelPath: path.resolve(modelPath), gpuLayers: 0 });
const context = await model.createContext({ contextSize: promptIds.length + nGen + 1, batchSize: 64,
                                            threads: 2, sequences: 1 });
const sequence = context.getSequence();
const out = [];
const iter = sequence.evaluate(promptIds, { temperature: 0, yieldEogToken: true });
for (let r = await iter.next(); !r.done && out.length < nGen; r = await iter.next()) out.push(r.value);
await iter.return();
process.stdout.write(JSON.stringify({ engine: "llama.cpp (node-llama-cpp)", prompt_ids: promptIds,
                                      generated_ids: out }) + "\n");
await context.dispose();
await model.dispose();
