// The openai npm SDK's stream helper against a Responses server: prints the final response.
// usage: node openai_stream.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const stream = client.responses.stream({
  model,
  input: "Say hello in five words.",
  max_output_tokens: 24,
  temperature: 0,
});
const types = [];
for await (const event of stream) types.push(event.type);
const final = await stream.finalResponse();
console.log(JSON.stringify({ status: final.status, text: final.output_text, types }));
