// Vercel AI SDK (`@ai-sdk/openai` .responses()) streamText with one tool, run to a final answer.
// usage: node aisdk_tool.mjs BASE_URL MODEL
import { createOpenAI } from "@ai-sdk/openai";
import { stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, model] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey: "unused", fetch: (...a) => recording(...a) });
const calls = [];
const bodies = [];
const recording = async (url, init) => {
  if (init?.body) bodies.push(JSON.parse(init.body));
  return fetch(url, init);
};
const result = streamText({
  model: openai.responses(model),
  prompt: "What's the weather in Paris?",
  tools: {
    get_weather: tool({
      description: "Get the current weather for a city.",
      inputSchema: z.object({ location: z.string() }),
      execute: async ({ location }) => {
        calls.push(location);
        return { location, temp_c: 18, condition: "light rain" };
      },
    }),
  },
  stopWhen: stepCountIs(3),
  maxOutputTokens: 60,
  temperature: 0,
  // `store` is left at its default (true): the second step refers to the first step's
  // items with `item_reference`, which the server resolves from its store.
});
for await (const part of result.fullStream) {
  if (part.type === "error") throw part.error;
}
const steps = await result.steps;
console.log(JSON.stringify({
  calls,
  finishReason: await result.finishReason,
  text: await result.text,
  steps: steps.map((s) => s.finishReason),
  inputTypes: bodies.map((b) => (Array.isArray(b.input) ? b.input.map((i) => i.type ?? i.role) : [])),
}));
