//! A client on 2026-07-28 with a server on 2025-11-25: a tool that server lists as one
//! that runs only as a task (`execution.taskSupport: "required"`) is called as that
//! revision's task-augmented call, and the task it makes reaches the client as the tasks
//! extension has it (`relayed`), under an id of the gateway's. The client's `tasks/get`
//! asks the server's `tasks/get`, and once the task has ended its `tasks/result`, for the
//! result (or error) the extension carries in the task itself; `tasks/cancel` is the
//! server's. Not bridged: a task that waits for the client's input (2025-11-25 asks it on
//! the `tasks/result` request, which the extension has no place for): it is cancelled on
//! the server and reported failed, saying so.
//!
//! Like 2025-11-25's own task calls (`super`), the call is made once: no retries, no
//! alternatives; a failure to create the task is the client's JSON-RPC error.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientRequest, CreateTaskResult, CustomRequest,
    DetailedTask, GetTaskResult, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;

use super::super::server::{Gateway, task_owner};
use super::relayed::Origin;
use super::{as_sent, as_value};
use crate::transport::tasks::TaskSupport;

/// How long the server is asked to keep a bridged task (the client cannot say).
const TTL_MS: u64 = 3_600_000;

/// How many polls in a row may find a task ended and fail to have its result before it is
/// answered failed.
const RESULT_TRIES: u32 = 3;

impl Gateway {
    /// Whether `request`, from the client of `cx`, is a call to bridge: the client is on
    /// 2026-07-28 and declared the tasks extension, and the tool runs only as a task, on a
    /// server on 2025-11-25 (only such a server's listing says so). Waits for the servers'
    /// start-up, as every call does, to know.
    pub(in crate::gateway) async fn bridges(
        &self,
        request: &CallToolRequestParams,
        cx: &RequestContext<RoleServer>,
    ) -> bool {
        if !super::super::call::declares_tasks(cx, true) {
            return false;
        }
        // Cancelled meanwhile, the call ends as any call would (`Gateway::answer_call`).
        if self.ready(cx).await.is_err() {
            return false;
        }
        self.own.catalogue().task_support(&request.name) == Some(TaskSupport::Required)
    }

    /// The call of `request` as a 2025-11-25 task (see the module).
    pub(in crate::gateway) async fn bridge_call(
        &self,
        request: CallToolRequestParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let (server, upstream_name, to) = self.task_upstream(&name, cx).await?;
        let owner = task_owner(cx);
        if !self.hub.routing.relayed.has_room(owner.as_deref()) {
            return Err(ErrorData::invalid_params(
                format!("tool `{name}` runs only as a task, and the gateway has no room for another of this client's"),
                None,
            ));
        }
        let mut params = json!({"name": upstream_name, "task": {"ttl": TTL_MS}});
        if let Some(arguments) = request.arguments {
            params["arguments"] = Value::Object(arguments);
        }
        let out = as_sent(self, &to, "tools/call", params, false, cx);
        let answer = as_value(self.forward(&to, out, cx).await.map_err(|f| f.into_error(&server))?)?;
        let Some(made) = answer.get("task") else {
            // Answered at once after all.
            let result: CallToolResult = serde_json::from_value(answer).map_err(|e| {
                ErrorData::internal_error(format!("server `{server}` answered with no result: {e}"), None)
            })?;
            return Ok(result.into());
        };
        let created = CreateTaskResult::new(task_of(made).ok_or_else(|| {
            ErrorData::internal_error(format!("server `{server}` answered the call with a task that is not one"), None)
        })?);
        self.given_again(&server, &to, &created.task.task_id)?;
        let session = &to.session;
        let origin = Origin { server: &server, tool: &name, instance: to.instance, session, owner, legacy: true };
        let kept = self.hub.routing.relayed.keep(created, origin);
        Ok(CallToolResponse::Task(kept.map_err(|f| ErrorData::internal_error(f.message(), None))?))
    }

    /// A 2025-11-25 server's task `upstream` as the extension reports it, under `id`:
    /// `None` if its instance is gone (see `relayed::to_task`).
    pub(super) async fn legacy_get(
        &self,
        entry: &super::relayed::Entry,
        id: &str,
        cx: &RequestContext<RoleServer>,
    ) -> Option<Result<GetTaskResult, ErrorData>> {
        if let Some(why) = entry.ended_as.get() {
            return Some(Ok(self.failed_for_good(id, entry, why)));
        }
        let ask = |method: &'static str| move |upstream: &str| legacy_request(method, upstream);
        let got = match self.to_task(entry, "tasks/get", ask("tasks/get"), cx).await? {
            Ok(answer) => answer,
            Err(e) => {
                // The server no longer knows it (its time to live ran out): neither do we.
                if e.code == rmcp::model::ErrorCode::INVALID_PARAMS {
                    self.hub.routing.relayed.forget(id);
                }
                return Some(Err(e));
            }
        };
        let Some(mut task) = as_value(got).ok().as_ref().and_then(task_of) else {
            return Some(Err(ErrorData::internal_error(
                "the server answered tasks/get with something that is not a task",
                None,
            )));
        };
        task.task_id = id.to_owned();
        let payload = match task.status {
            TaskStatus::Completed | TaskStatus::Failed => {
                match self.to_task(entry, "tasks/result", ask("tasks/result"), cx).await? {
                    // The call's result, an `isError` one too: in the extension, the task
                    // completed (`failed` is for a JSON-RPC error).
                    Ok(result) => match as_value(result) {
                        Ok(Value::Object(result)) => TaskPayload::Completed { result },
                        Ok(_) => TaskPayload::Failed {
                            error: error(task.status_message.as_deref().unwrap_or("the task failed")),
                        },
                        Err(e) => return Some(Err(e)),
                    },
                    // A poll its client cancelled missed nothing of the server's.
                    Err(e) if cx.ct.is_cancelled() => return Some(Err(e)),
                    // Its result could not be had this time: asked again on the next polls,
                    // and past a few misses in a row the task failed, for good.
                    Err(e) => {
                        if entry.result_misses.fetch_add(1, Ordering::AcqRel) + 1 < RESULT_TRIES {
                            return Some(Err(e));
                        }
                        let why = format!("it ended, but its result could not be had: {}", e.message);
                        return Some(Ok(self.failed_for_good(id, entry, &why)));
                    }
                }
            }
            TaskStatus::InputRequired => {
                // 2025-11-25 asks on the `tasks/result` request, which the extension has no
                // place for: the task could never go on, so it is cancelled and ends here,
                // whether or not the client still waits for this poll.
                let mut apart = cx.clone();
                apart.ct = tokio_util::sync::CancellationToken::new();
                let _ = self.to_task(entry, "tasks/cancel", ask("tasks/cancel"), &apart).await;
                let why = "the server asked the client for input, which a client on 2026-07-28 cannot give a server on 2025-11-25 through Rebound: the task was cancelled";
                return Some(Ok(self.failed_for_good(id, entry, why)));
            }
            TaskStatus::Cancelled => TaskPayload::Cancelled,
            _ => TaskPayload::Working,
        };
        Some(Ok(GetTaskResult::new(DetailedTask::new(task, payload))))
    }
}

/// A 2025-11-25 request about task `upstream`, sent as it is.
pub(super) fn legacy_request(method: &str, upstream: &str) -> ClientRequest {
    ClientRequest::CustomRequest(CustomRequest::new(method, Some(json!({"taskId": upstream}))))
}

/// A 2025-11-25 `Task` as the extension's: `ttl` and `pollInterval` become `ttlMs` and
/// `pollIntervalMs`; `None` if it is not a task.
fn task_of(value: &Value) -> Option<Task> {
    let status = serde_json::from_value::<TaskStatus>(value.get("status")?.clone()).ok()?;
    let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut task = Task::new(
        text("taskId")?,
        status,
        text("createdAt").unwrap_or_default(),
        text("lastUpdatedAt").unwrap_or_default(),
    );
    task.status_message = text("statusMessage");
    task.ttl_ms = value.get("ttl").and_then(Value::as_u64);
    task.poll_interval_ms = value.get("pollInterval").and_then(Value::as_u64);
    Some(task)
}

/// A JSON-RPC error object for a failed task.
fn error(message: &str) -> serde_json::Map<String, Value> {
    let error = json!({"code": rmcp::model::ErrorCode::INTERNAL_ERROR.0, "message": message});
    error.as_object().cloned().unwrap_or_default()
}
