// A browser-like terminal client for tests/integration/test_shim_terminal.py,
// on the `ws` package. Usage: node term.js '<json options>' where options are
// {"url", "headers": {...}, "protocols": [...]}.
//
// It speaks JSON lines: commands on stdin, events on stdout.
//   in:  {"op": "binary", "b64"}  {"op": "text", "text"}  {"op": "close", "code"}
//        {"op": "destroy"} (drops the TCP connection without a close frame)
//   out: {"ev": "open", "protocol"}  {"ev": "binary", "b64"}  {"ev": "text", "text"}
//        {"ev": "close", "code", "reason"}  {"ev": "error", "message"}
//        {"ev": "http", "status", "body"} (the server answered without upgrading)
'use strict';

const readline = require('readline');
const WebSocket = require('ws');

const opts = JSON.parse(process.argv[2]);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');

const ws = new WebSocket(opts.url, opts.protocols || [], { headers: opts.headers || {} });

ws.on('unexpected-response', (req, res) => {
  let body = '';
  res.setEncoding('utf8');
  res.on('data', (d) => { body += d; });
  res.on('end', () => { out({ ev: 'http', status: res.statusCode, body }); process.exit(0); });
});
ws.on('open', () => out({ ev: 'open', protocol: ws.protocol }));
ws.on('message', (data, isBinary) => {
  if (isBinary) out({ ev: 'binary', b64: Buffer.from(data).toString('base64') });
  else out({ ev: 'text', text: data.toString('utf8') });
});
ws.on('close', (code, reason) => {
  out({ ev: 'close', code, reason: reason.toString('utf8') });
  process.exit(0);
});
ws.on('error', (err) => out({ ev: 'error', message: String(err && err.message) }));

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  const cmd = JSON.parse(line);
  if (cmd.op === 'binary') ws.send(Buffer.from(cmd.b64, 'base64'), { binary: true });
  else if (cmd.op === 'text') ws.send(cmd.text, { binary: false });
  else if (cmd.op === 'close') ws.close(cmd.code || 1000);
  else if (cmd.op === 'destroy') { ws.terminate(); process.exit(0); }
});
rl.on('close', () => ws.terminate());
