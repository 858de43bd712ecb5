// Vercel AI SDK (`@ai-sdk/openai` .responses()) generateText, two turns, `store` left at its
// default (true): turn 2 names turn 1's assistant message with an `item_reference`, which the
// server resolves from its store.
// usage: node aisdk_turns.mjs BASE_URL MODEL
import { createOpenAI } from "@ai-sdk/openai";
import { generateText } from "ai";

const [baseURL, model] = process.argv.slice(2);
const bodies = [];
const openai = createOpenAI({
  baseURL,
  apiKey: "unused",
  fetch: async (url, init) => {
    if (init?.body) bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const messages = [{ role: "user", content: "My name is Ada. Say hello to me." }];
const first = await generateText({ model: openai.responses(model), messages, maxOutputTokens: 24, temperature: 0 });
messages.push(...first.response.messages, { role: "user", content: "What is my name?" });
const second = await generateText({ model: openai.responses(model), messages, maxOutputTokens: 24, temperature: 0 });
console.log(JSON.stringify({
  first: first.text,
  second: second.text,
  secondInput: bodies[1].input,
  finishReasons: [first.finishReason, second.finishReason],
}));
