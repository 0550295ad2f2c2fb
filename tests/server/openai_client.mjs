// Drives a running `redlite serve` with the official OpenAI client (a client nobody here wrote):
// chat and completions, streamed and whole, greedy. Prints one JSON object with what it got.
// usage: node openai_client.mjs BASE_URL API_KEY
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const messages = [
  { role: "system", content: "You are a helpful assistant." },
  { role: "user", content: "What is the capital of France? Answer briefly." },
];
const out = {};

const chat = await client.chat.completions.create({ model: "redlite", messages, max_tokens: 24, temperature: 0 });
out.chat = { text: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage };

let streamed = "";
let streamFinish = null;
let streamUsage = null;
const stream = await client.chat.completions.create({
  model: "redlite", messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.usage) streamUsage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.content) streamed += c.delta.content;
    if (c.finish_reason) streamFinish = c.finish_reason;
  }
}
out.chat_stream = { text: streamed, finish: streamFinish, usage: streamUsage };

const prompt = "The quick brown fox jumps over the lazy dog.";
const cmpl = await client.completions.create({ model: "redlite", prompt, max_tokens: 24, temperature: 0 });
out.completion = { text: cmpl.choices[0].text, finish: cmpl.choices[0].finish_reason, usage: cmpl.usage };

let cstreamed = "";
const cstream = await client.completions.create({ model: "redlite", prompt, max_tokens: 24, temperature: 0, stream: true });
for await (const chunk of cstream) for (const c of chunk.choices) cstreamed += c.text ?? "";
out.completion_stream = { text: cstreamed };

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

// A wrong key is an AuthenticationError (401) in the client.
try {
  const bad = new OpenAI({ baseURL, apiKey: apiKey + "x", maxRetries: 0 });
  await bad.models.list();
  out.bad_key = "accepted";
} catch (e) {
  out.bad_key = e.status;
}
console.log(JSON.stringify(out));
