// MCP 2025-11-25 tasks as the official TypeScript SDK's client drives them, against a
// server given as a command line (the gateway, or a server directly) or as the URL of a
// gateway over streamable HTTP. Prints one JSON
// object of what it saw. Modes:
//   list   the server's tasks capability and its tools' `execution`
//   run    a task-augmented call of server-everything's `simulate-research-query`,
//          ambiguous, so the server asks the client a question while the task runs;
//          then the session's task list
//   quiet  the same, not ambiguous
//   lose   the same call, then the server behind the gateway is killed (SIGKILL, found
//          as the gateway's child running server-everything); the client waits to
//          be told the task failed, then polls it until it is reported failed
//   heard  a task the client hears end only from the server's status notification (it
//          never asks), and whose server is then killed
//   many   tasks started until the gateway refuses one (it keeps 256 per client)
//   progress  a task-augmented call of faulty-server's `slow` (with `--tasks`), which
//          reports its progress as the task runs, after the call was answered
//   asked  tasks the other way: the client says it runs sampling and elicitation as
//          tasks (and keeps them in the SDK's task store); server-everything's
//          `trigger-sampling-request-async` and `trigger-elicitation-request-async` (those
//          it offers) ask it so, then poll the client's task until it completes and fetch
//          its result
import { readFileSync, readdirSync } from "node:fs";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks";
import {
  CallToolResultSchema,
  CreateMessageRequestSchema,
  CreateTaskResultSchema,
  ElicitRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [mode, command, ...args] = process.argv.slice(2);
// In `asked` mode the client runs sampling and elicitation as tasks of its own.
const runsTasks = mode === "asked";
const capabilities = runsTasks
  ? {
      sampling: {},
      elicitation: {},
      tasks: { list: {}, cancel: {}, requests: { sampling: { createMessage: {} }, elicitation: { create: {} } } },
    }
  : { elicitation: {} };
const client = new Client(
  { name: "tasks-client", version: "1.0.0" },
  { capabilities, ...(runsTasks ? { taskStore: new InMemoryTaskStore() } : {}) },
);
const asked = [];
/** `result` at once, or, for a request that asks for a task, a task that has it 300 ms later. */
async function answer(request, extra, result) {
  if (!request.params.task) return result;
  const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl });
  setTimeout(() => extra.taskStore.storeTaskResult(task.taskId, "completed", result), 300);
  asked.push({ method: request.method, task: task.taskId });
  return { task };
}
client.setRequestHandler(ElicitRequestSchema, async (request, extra) => {
  if (!runsTasks) asked.push(request.params.message);
  const content = runsTasks ? { name: "Ada" } : { interpretation: "technical" };
  return answer(request, extra, { action: "accept", content });
});
if (runsTasks) {
  client.setRequestHandler(CreateMessageRequestSchema, async (request, extra) =>
    answer(request, extra, { role: "assistant", content: { type: "text", text: "sampled" }, model: "test-model" }),
  );
}
const statuses = [];
client.fallbackNotificationHandler = async (n) => {
  if (n.method === "notifications/tasks/status") statuses.push(n.params);
};
// A URL is a gateway over streamable HTTP (its token in REBOUND_AUTH_TOKEN).
const transport = command.startsWith("http")
  ? new StreamableHTTPClientTransport(new URL(command), {
      requestInit: { headers: { Authorization: `Bearer ${process.env.REBOUND_AUTH_TOKEN}` } },
    })
  : new StdioClientTransport({ command, args, stderr: "inherit" });
await client.connect(transport);

const out = { capability: client.getServerCapabilities()?.tasks ?? null };
const tools = (await client.listTools()).tools;
out.execution = Object.fromEntries(tools.filter((t) => t.execution).map((t) => [t.name, t.execution]));

const research = { name: "simulate-research-query", arguments: { topic: "gateways", ambiguous: mode === "run" } };

/** Runs the call as a task until it is created; the rest of the stream, if `all`. */
async function call(all) {
  const seen = [];
  const stream = client.experimental.tasks.callToolStream(research, CallToolResultSchema, { task: { ttl: 60000 } });
  for await (const message of stream) {
    seen.push(message);
    if (message.type === "taskCreated" && !all) break;
  }
  return seen;
}

/** The pid of the gateway's child that runs server-everything. */
function everything() {
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const ppid = Number(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ")[1]);
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      if (ppid === transport.pid && cmdline.includes("server-everything")) return Number(pid);
    } catch {
      // gone meanwhile
    }
  }
  throw new Error("no server-everything process under the gateway");
}

if (mode === "run" || mode === "quiet") {
  const seen = await call(true);
  out.types = seen.map((m) => m.type);
  out.created = seen.find((m) => m.type === "taskCreated")?.task ?? null;
  const result = seen.find((m) => m.type === "result")?.result;
  out.text = result?.content?.map((c) => c.text).join("\n") ?? null;
  out.error = seen.find((m) => m.type === "error")?.error?.message ?? null;
  out.asked = asked;
  out.statuses = statuses;
  out.listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => ({ taskId: t.taskId, status: t.status }));
} else if (mode === "lose") {
  const seen = await call(false);
  const id = seen.find((m) => m.type === "taskCreated").task.taskId;
  out.created = { taskId: id };
  process.kill(everything(), "SIGKILL");
  const until = Date.now() + 20000;
  // Told without asking?
  while (!statuses.some((s) => s.status === "failed") && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  out.toldFirst = statuses.some((s) => s.status === "failed");
  let task;
  do {
    await new Promise((resolve) => setTimeout(resolve, 100));
    task = await client.experimental.tasks.getTask(id);
  } while (task.status !== "failed" && Date.now() < until);
  out.task = task;
  out.result = await client.experimental.tasks.getTaskResult(id, CallToolResultSchema);
  out.statuses = statuses;
} else if (mode === "heard") {
  const params = { ...research, task: { ttl: 60000 } };
  const id = (await client.request({ method: "tools/call", params }, CreateTaskResultSchema)).task.taskId;
  out.created = { taskId: id };
  const until = Date.now() + 20000;
  while (!statuses.some((s) => s.taskId === id && s.status === "completed") && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  out.heard = statuses.filter((s) => s.taskId === id).map((s) => s.status);
  process.kill(everything(), "SIGKILL");
  await new Promise((resolve) => setTimeout(resolve, 1000));
  try {
    out.result = await client.experimental.tasks.getTaskResult(id, CallToolResultSchema);
  } catch (error) {
    out.resultError = error.message;
  }
  try {
    out.task = await client.experimental.tasks.getTask(id);
  } catch (error) {
    out.error = error.message;
  }
  out.statuses = statuses;
} else if (mode === "progress") {
  const progress = [];
  const slow = { name: "slow", arguments: { ms: 800, steps: 3 } };
  const onprogress = (p) => progress.push(p.progress);
  const seen = [];
  const stream = client.experimental.tasks.callToolStream(slow, CallToolResultSchema, { task: { ttl: 60000 }, onprogress });
  for await (const message of stream) seen.push(message);
  out.types = seen.map((m) => m.type);
  out.text = seen.find((m) => m.type === "result")?.result?.content?.map((c) => c.text).join("\n") ?? null;
  out.progress = progress;
  out.error = seen.find((m) => m.type === "error")?.error?.message ?? null;
} else if (mode === "asked") {
  out.tools = tools.map((t) => t.name).sort();
  out.texts = {};
  for (const name of ["trigger-sampling-request-async", "trigger-elicitation-request-async"]) {
    if (!out.tools.includes(name)) continue;
    const args = name.includes("sampling") ? { prompt: "hello" } : {};
    const result = await client.callTool({ name, arguments: args }, CallToolResultSchema, { timeout: 60000 });
    out.texts[name] = result.content.map((c) => c.text).join("\n");
  }
  out.asked = asked;
} else if (mode === "many") {
  out.started = 0;
  out.refusal = null;
  while (out.started < 300 && out.refusal === null) {
    const seen = await call(false);
    const error = seen.find((m) => m.type === "error");
    if (error) out.refusal = error.error.message;
    else out.started += 1;
  }
  out.listed = (await client.experimental.tasks.listTasks()).tasks.length;
}
console.log(JSON.stringify(out));
await client.close();
// The task store's timers (each task's time to live) would keep the process alive.
if (runsTasks) process.exit(0);
