// The MCP server behind the gateway when the official conformance suite
// (@modelcontextprotocol/conformance) runs against Rebound: it offers what the suite's
// active server scenarios ask for, over stdio, built on the official TypeScript SDK.
// The suite talks HTTP to the gateway; whatever it checks has crossed the gateway twice.
//
// Run by `cargo xtask conformance` (part of `cargo xtask test`).

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

// A 1×1 PNG and a silent WAV, both valid base64.
const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (t) => ({ type: "text", text: t });
const noArguments = { type: "object", properties: {} };

const server = new Server(
  { name: "rebound-conformance-fixture", version: "1.0.0" },
  {
    capabilities: {
      tools: { listChanged: true },
      resources: { subscribe: true, listChanged: true },
      prompts: { listChanged: true },
      logging: {},
      completions: {},
    },
  },
);

const tools = [
  { name: "test_simple_text", description: "Answers with one text block", inputSchema: noArguments },
  { name: "test_image_content", description: "Answers with a PNG image", inputSchema: noArguments },
  { name: "test_audio_content", description: "Answers with a WAV clip", inputSchema: noArguments },
  { name: "test_embedded_resource", description: "Answers with an embedded text resource", inputSchema: noArguments },
  {
    name: "test_multiple_content_types",
    description: "Answers with text, an image and a resource",
    inputSchema: noArguments,
  },
  { name: "test_tool_with_logging", description: "Logs three messages while it runs", inputSchema: noArguments },
  { name: "test_error_handling", description: "Always fails, as a tool result", inputSchema: noArguments },
  { name: "test_tool_with_progress", description: "Reports progress three times", inputSchema: noArguments },
  {
    name: "test_sampling",
    description: "Asks the client's model to complete a prompt",
    inputSchema: {
      type: "object",
      properties: { prompt: { type: "string", description: "The prompt to send to the LLM" } },
      required: ["prompt"],
    },
  },
  {
    name: "test_elicitation",
    description: "Asks the user for a name and an email address",
    inputSchema: {
      type: "object",
      properties: { message: { type: "string", description: "The message to show the user" } },
      required: ["message"],
    },
  },
  {
    name: "test_elicitation_sep1034_defaults",
    description: "Asks the user with a form whose fields have defaults",
    inputSchema: noArguments,
  },
  {
    name: "test_elicitation_sep1330_enums",
    description: "Asks the user to pick from every kind of enum field",
    inputSchema: noArguments,
  },
  {
    name: "json_schema_2020_12_tool",
    description: "A tool whose input schema uses JSON Schema 2020-12 keywords",
    inputSchema: {
      $schema: "https://json-schema.org/draft/2020-12/schema",
      type: "object",
      $defs: {
        address: { type: "object", properties: { street: { type: "string" }, city: { type: "string" } } },
      },
      properties: { name: { type: "string" }, address: { $ref: "#/$defs/address" } },
      additionalProperties: false,
    },
  },
];

const defaultsForm = {
  message: "Please review and update the form fields with defaults",
  requestedSchema: {
    type: "object",
    properties: {
      name: { type: "string", description: "User name", default: "John Doe" },
      age: { type: "integer", description: "User age", default: 30 },
      score: { type: "number", description: "User score", default: 95.5 },
      status: { type: "string", description: "User status", enum: ["active", "inactive", "pending"], default: "active" },
      verified: { type: "boolean", description: "Verification status", default: true },
    },
    required: [],
  },
};

const titled = (prefix) =>
  ["First", "Second", "Third"].map((word, i) => ({ const: `value${i + 1}`, title: `${word} ${prefix}` }));

const enumsForm = {
  message: "Please select options from the enum fields",
  requestedSchema: {
    type: "object",
    properties: {
      untitledSingle: { type: "string", description: "Select one option", enum: ["option1", "option2", "option3"] },
      titledSingle: { type: "string", description: "Select one option with titles", oneOf: titled("Option") },
      legacyEnum: {
        type: "string",
        description: "Select one option (legacy)",
        enum: ["opt1", "opt2", "opt3"],
        enumNames: ["Option One", "Option Two", "Option Three"],
      },
      untitledMulti: {
        type: "array",
        description: "Select multiple options",
        minItems: 1,
        maxItems: 3,
        items: { type: "string", enum: ["option1", "option2", "option3"] },
      },
      titledMulti: {
        type: "array",
        description: "Select multiple options with titles",
        minItems: 1,
        maxItems: 3,
        items: { anyOf: titled("Choice") },
      },
    },
    required: [],
  },
};

async function elicit(extra, params) {
  const answer = await extra.sendRequest({ method: "elicitation/create", params }, ElicitResultSchema);
  return `action=${answer.action}, content=${JSON.stringify(answer.content ?? {})}`;
}

server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));

server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
  const args = request.params.arguments ?? {};
  switch (request.params.name) {
    case "test_simple_text":
      return { content: [text("This is a simple text response for testing.")] };
    case "test_image_content":
      return { content: [{ type: "image", data: PNG, mimeType: "image/png" }] };
    case "test_audio_content":
      return { content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }] };
    case "test_embedded_resource":
      return {
        content: [
          {
            type: "resource",
            resource: { uri: "test://embedded-resource", mimeType: "text/plain", text: "This is an embedded resource content." },
          },
        ],
      };
    case "test_multiple_content_types":
      return {
        content: [
          text("Multiple content types test:"),
          { type: "image", data: PNG, mimeType: "image/png" },
          {
            type: "resource",
            resource: {
              uri: "test://mixed-content-resource",
              mimeType: "application/json",
              text: JSON.stringify({ test: "data", value: 123 }),
            },
          },
        ],
      };
    case "test_tool_with_logging":
      for (const data of ["Tool execution started", "Tool processing data", "Tool execution completed"]) {
        await extra.sendNotification({
          method: "notifications/message",
          params: { level: "info", logger: "conformance-fixture", data },
        });
        await sleep(50);
      }
      return { content: [text("Tool with logging executed successfully")] };
    case "test_error_handling":
      return { isError: true, content: [text("This tool intentionally returns an error for testing")] };
    case "test_tool_with_progress": {
      const progressToken = request.params._meta?.progressToken;
      for (const progress of [0, 50, 100]) {
        if (progressToken !== undefined) {
          await extra.sendNotification({
            method: "notifications/progress",
            params: { progressToken, progress, total: 100, message: `Completed step ${progress} of 100` },
          });
        }
        await sleep(50);
      }
      return { content: [text("Progress test completed")] };
    }
    case "test_sampling": {
      const answer = await extra.sendRequest(
        {
          method: "sampling/createMessage",
          params: { messages: [{ role: "user", content: text(String(args.prompt ?? "")) }], maxTokens: 100 },
        },
        CreateMessageResultSchema,
      );
      const said = answer.content?.type === "text" ? answer.content.text : JSON.stringify(answer.content);
      return { content: [text(`LLM response: ${said}`)] };
    }
    case "test_elicitation": {
      const params = {
        message: String(args.message ?? "Please provide your information"),
        requestedSchema: {
          type: "object",
          properties: {
            username: { type: "string", description: "User's response" },
            email: { type: "string", description: "User's email address" },
          },
          required: ["username", "email"],
        },
      };
      return { content: [text(`User response: ${await elicit(extra, params)}`)] };
    }
    case "test_elicitation_sep1034_defaults":
      return { content: [text(`Elicitation completed: ${await elicit(extra, defaultsForm)}`)] };
    case "test_elicitation_sep1330_enums":
      return { content: [text(`Elicitation completed: ${await elicit(extra, enumsForm)}`)] };
    case "json_schema_2020_12_tool":
      return { content: [text(`Hello, ${args.name ?? "nobody"}`)] };
    default:
      return { isError: true, content: [text(`unknown tool ${request.params.name}`)] };
  }
});

const resources = [
  {
    uri: "test://static-text",
    name: "static-text",
    description: "A static text resource for testing",
    mimeType: "text/plain",
  },
  {
    uri: "test://static-binary",
    name: "static-binary",
    description: "A static binary resource (image) for testing",
    mimeType: "image/png",
  },
  {
    uri: "test://watched-resource",
    name: "watched-resource",
    description: "A resource clients may subscribe to",
    mimeType: "text/plain",
  },
];

server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources }));

server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
  resourceTemplates: [
    {
      uriTemplate: "test://template/{id}/data",
      name: "template-data",
      description: "Data for any id",
      mimeType: "application/json",
    },
  ],
}));

server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
  const uri = request.params.uri;
  if (uri === "test://static-text") {
    return { contents: [{ uri, mimeType: "text/plain", text: "This is the content of the static text resource." }] };
  }
  if (uri === "test://static-binary") {
    return { contents: [{ uri, mimeType: "image/png", blob: PNG }] };
  }
  if (uri === "test://watched-resource") {
    return { contents: [{ uri, mimeType: "text/plain", text: "Watched resource content" }] };
  }
  const templated = /^test:\/\/template\/([^/]+)\/data$/.exec(uri);
  if (templated) {
    const id = templated[1];
    const data = { id, templateTest: true, data: `Data for ID: ${id}` };
    return { contents: [{ uri, mimeType: "application/json", text: JSON.stringify(data) }] };
  }
  throw new Error(`no resource ${uri}`);
});

const subscriptions = new Set();
server.setRequestHandler(SubscribeRequestSchema, async (request) => {
  subscriptions.add(request.params.uri);
  return {};
});
server.setRequestHandler(UnsubscribeRequestSchema, async (request) => {
  subscriptions.delete(request.params.uri);
  return {};
});

const prompts = [
  { name: "test_simple_prompt", description: "A prompt without arguments" },
  {
    name: "test_prompt_with_arguments",
    description: "A prompt with two required arguments",
    arguments: [
      { name: "arg1", description: "First test argument", required: true },
      { name: "arg2", description: "Second test argument", required: true },
    ],
  },
  {
    name: "test_prompt_with_embedded_resource",
    description: "A prompt that embeds a resource",
    arguments: [{ name: "resourceUri", description: "URI of the resource to embed", required: true }],
  },
  { name: "test_prompt_with_image", description: "A prompt with an image" },
];

server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts }));

server.setRequestHandler(GetPromptRequestSchema, async (request) => {
  const args = request.params.arguments ?? {};
  const user = (content) => ({ role: "user", content });
  switch (request.params.name) {
    case "test_simple_prompt":
      return { messages: [user(text("This is a simple prompt for testing."))] };
    case "test_prompt_with_arguments":
      return { messages: [user(text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`))] };
    case "test_prompt_with_embedded_resource":
      return {
        messages: [
          user({
            type: "resource",
            resource: { uri: args.resourceUri, mimeType: "text/plain", text: "Embedded resource content for testing." },
          }),
          user(text("Please process the embedded resource above.")),
        ],
      };
    case "test_prompt_with_image":
      return {
        messages: [
          user({ type: "image", data: PNG, mimeType: "image/png" }),
          user(text("Please analyze the image above.")),
        ],
      };
    default:
      throw new Error(`no prompt ${request.params.name}`);
  }
});

server.setRequestHandler(CompleteRequestSchema, async (request) => {
  const { ref, argument } = request.params;
  const choices = ref.type === "ref/prompt" && ref.name === "test_prompt_with_arguments" ? ["test", "testing", "tested"] : [];
  const values = choices.filter((c) => c.startsWith(argument.value));
  return { completion: { values, total: values.length, hasMore: false } };
});

server.setRequestHandler(SetLevelRequestSchema, async (request) => {
  await server.sendLoggingMessage({ level: "info", logger: "conformance-fixture", data: `Log level set to: ${request.params.level}` });
  return {};
});

await server.connect(new StdioServerTransport());
