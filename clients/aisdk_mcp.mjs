// Vercel AI SDK (`@ai-sdk/openai` .responses()) streamText with an MCP server as a provider tool:
// the server lists and runs its tools, the SDK reads the results from the stream.
// usage: node aisdk_mcp.mjs BASE_URL MODEL MCP_SERVER_URL
import { createOpenAI } from "@ai-sdk/openai";
import { streamText } from "ai";

const [baseURL, model, serverUrl] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey: "unused" });
const result = streamText({
  model: openai.responses(model),
  prompt: "Open the vault with the code 1234 and tell me the word inside.",
  tools: {
    vault: openai.tools.mcp({
      serverLabel: "vault",
      serverUrl,
      allowedTools: ["open_vault"],
      requireApproval: "never",
    }),
  },
  toolChoice: { type: "tool", toolName: "vault" },
  maxOutputTokens: 60,
  temperature: 0,
});
const parts = [];
for await (const part of result.fullStream) {
  if (part.type === "error") throw part.error;
  if (part.type === "tool-call" || part.type === "tool-result") parts.push(part);
}
console.log(JSON.stringify({
  text: await result.text,
  finishReason: await result.finishReason,
  calls: parts.filter((p) => p.type === "tool-call").map((p) => ({ name: p.toolName, input: p.input, executed: p.providerExecuted })),
  results: parts.filter((p) => p.type === "tool-result").map((p) => ({ name: p.toolName, output: p.output })),
}));
