// Parse HCL documents with HashiCorp's own HCL library (hcl2json: Go's hashicorp/hcl built to
// WebAssembly), many per process: one request per stdin line {"name", "text"}, one answer per
// stdout line {"ok": <json>} or {"error": "<parser diagnostics>"}, in order.
const readline = require("readline");
const { parse } = require("@cdktf/hcl2json");

const rl = readline.createInterface({ input: process.stdin, terminal: false });
let queue = Promise.resolve();
rl.on("line", (line) => {
  queue = queue.then(async () => {
    let answer;
    try {
      const req = JSON.parse(line);
      answer = { ok: await parse(req.name || "job.nomad.hcl", req.text) };
    } catch (err) {
      answer = { error: String(err && err.message ? err.message : err) };
    }
    process.stdout.write(JSON.stringify(answer) + "\n");
  });
});
