// A whole tool loop per chat format, through the official OpenAI client: a streamed request whose
// reply must be a call (tool_choice "required"), assembled from the streamed deltas by the
// client's own ChatCompletionStream; then the assistant message with the call and a `tool`
// message with the result go back, and the second turn is answered (streamed, with usage).
// The servers run concurrently, one per format. Prints one JSON object, keyed by format, with
// what was sent and received; the C++ test (test_openai_client.cpp) checks it.
// usage: node openai_tool_loop.mjs API_KEY FORMAT=BASE_URL ...
import OpenAI from "openai";

const [apiKey, ...servers] = process.argv.slice(2);

// Every parameter required and typed, so the reply exercises strings, integers and booleans.
const tools = [{
  type: "function",
  function: {
    name: "get_population",
    description: "Population of a city in a given year",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string" },
        year: { type: "integer" },
        exact: { type: "boolean" },
      },
      required: ["city", "year", "exact"],
    },
  },
}];

async function loop(baseURL) {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const messages = [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "How many people lived in Paris in 2020?" },
  ];
  const first = client.beta.chat.completions.stream({
    model: "redlite", messages, tools, tool_choice: "required", max_tokens: 256, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  // The client assembles content and tool_calls; reasoning_content is not an OpenAI field, so
  // its deltas are joined here (the client would keep only the last one).
  let reasoning = "";
  let toolCallChunks = 0;
  for await (const chunk of first) {
    for (const c of chunk.choices) {
      if (c.delta?.reasoning_content) reasoning += c.delta.reasoning_content;
      if (c.delta?.tool_calls?.length) toolCallChunks++;
    }
  }
  const done = await first.finalChatCompletion();
  const choice = done.choices[0];
  const assistant = { role: "assistant", content: choice.message.content ?? null, tool_calls: choice.message.tool_calls ?? [] };
  if (reasoning) assistant.reasoning_content = reasoning;
  const out = {
    tools,
    turn1: { messages, finish: choice.finish_reason, message: assistant, usage: done.usage, tool_call_chunks: toolCallChunks },
  };
  if (!assistant.tool_calls.length) return out;

  const call = assistant.tool_calls[0];
  let args = {};
  try {
    args = JSON.parse(call.function.arguments);
  } catch {
    // the test reports the arguments; the loop still sends a result back
  }
  const result = JSON.stringify({ city: args.city ?? null, year: args.year ?? null, population: 2102650 });
  const followUp = [...messages, assistant, { role: "tool", tool_call_id: call.id, content: result }];
  const second = client.beta.chat.completions.stream({
    model: "redlite", messages: followUp, tools, max_tokens: 8, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  for await (const _ of second);
  const answer = await second.finalChatCompletion();
  out.turn2 = { messages: followUp, finish: answer.choices[0].finish_reason, usage: answer.usage };
  return out;
}

const results = await Promise.all(servers.map(async (s) => {
  const at = s.indexOf("=");
  const [format, url] = [s.slice(0, at), s.slice(at + 1)];
  try {
    return [format, await loop(url)];
  } catch (e) {
    return [format, { error: String(e) }];
  }
}));
console.log(JSON.stringify(Object.fromEntries(results)));
