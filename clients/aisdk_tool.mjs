// Vercel AI SDK (`@ai-sdk/openai` .responses()) streamText with one tool, run to a final answer.
// usage: node aisdk_tool.mjs BASE_URL MODEL
import { createOpenAI } from "@ai-sdk/openai";
import { stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, model] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey: "unused" });
const calls = [];
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
  // oars stores nothing yet: without this the SDK refers to earlier items by id.
  providerOptions: { openai: { store: false } },
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
}));
