// Drives a running `redlite serve` with the official OpenAI client (a client nobody here wrote):
// chat and completions, streamed and whole, greedy; structured outputs (response_format
// json_schema, and tool_choice "required" against a second server whose chat format has tools).
// Prints one JSON object with what it got.
// usage: node openai_client.mjs BASE_URL API_KEY TOOLS_BASE_URL
import OpenAI from "openai";

const [baseURL, apiKey, toolsBaseURL] = process.argv.slice(2);
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

// Structured outputs: the documents go back to the test, which validates them with jsonschema.
const schema = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, population: { type: "integer" } },
  required: ["city", "population"],
  additionalProperties: false,
};
const response_format = { type: "json_schema", json_schema: { name: "city", strict: true, schema } };
const js = await client.chat.completions.create({ model: "redlite", messages, max_tokens: 48, temperature: 0, response_format });
let jsStreamed = "";
const jsStream = await client.chat.completions.create({
  model: "redlite", messages, max_tokens: 48, temperature: 0, response_format, stream: true,
});
for await (const chunk of jsStream) for (const c of chunk.choices) jsStreamed += c.delta?.content ?? "";
out.json_schema = { schema, text: js.choices[0].message.content, finish: js.choices[0].finish_reason, streamed: jsStreamed };

const tools = [{
  type: "function",
  function: {
    name: "get_population",
    description: "Population of a city",
    parameters: { type: "object", properties: { city: { type: "string" }, year: { type: "integer" } }, required: ["city"] },
  },
}];
const toolClient = new OpenAI({ baseURL: toolsBaseURL, apiKey, maxRetries: 0, timeout: 120000 });
const tc = await toolClient.chat.completions.create({
  model: "redlite", messages, max_tokens: 128, temperature: 0, tools, tool_choice: "required",
});
out.tool_required = { tools, finish: tc.choices[0].finish_reason, calls: tc.choices[0].message.tool_calls ?? [] };

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
