"""Remote MCP servers as server-side tools: the `mcp` tool of a request, the servers an operator
configures, which addresses a request may reach, and the client that lists and calls tools."""
