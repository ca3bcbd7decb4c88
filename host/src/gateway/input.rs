//! A server on MCP 2026-07-28 asks its client for input (sampling, elicitation, roots)
//! not with a request of its own but by answering the call with an `InputRequiredResult`;
//! the client answers each question and calls again with the answers and the server's
//! `requestState`. For a client on an older revision, the gateway plays that part: it
//! asks the client each question as the request its revision knows, under the same rules
//! as any server-to-client request (`routing::to_client`), and calls the server again.

use rmcp::model::{InputRequest, InputRequiredResult, InputResponses};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use super::routing::{ask, to_client};
use crate::transport::upstream::{Asker, UpstreamRequest};

/// At most this many rounds of questions in one call (as the SDKs allow), so that a
/// server cannot keep a call open by asking forever.
pub const MAX_ROUNDS: usize = 10;

/// At most this many questions in one round: each is put to the client in turn.
pub const MAX_QUESTIONS: usize = 16;

/// The client's answers to every question of `asked`, put to the client of `cx` one by
/// one, for server `server`'s upstream session `session`.
pub async fn answers(
    asked: &InputRequiredResult,
    server: &str,
    session: u64,
    cx: &RequestContext<RoleServer>,
) -> Result<InputResponses, ErrorData> {
    let count = asked.input_requests.as_ref().map_or(0, |q| q.len());
    if count > MAX_QUESTIONS {
        return Err(ErrorData::invalid_params(
            format!(
                "server `{server}` asked {count} questions at once; the gateway puts at most {MAX_QUESTIONS} to a client"
            ),
            None,
        ));
    }
    let mut answers = InputResponses::new();
    for (key, question) in asked.input_requests.iter().flatten() {
        let request = match question.clone() {
            InputRequest::CreateMessage(r) => UpstreamRequest::Sampling(r.params),
            InputRequest::Elicitation(r) => UpstreamRequest::Elicitation(r.params),
            InputRequest::ListRoots(_) => UpstreamRequest::Roots,
            other => {
                let what = serde_json::to_value(&other).ok().and_then(|v| v["method"].as_str().map(str::to_owned));
                return Err(ErrorData::invalid_params(
                    format!(
                        "server `{server}` asked its client `{}`, which no revision lets it ask",
                        what.unwrap_or_default()
                    ),
                    None,
                ));
            }
        };
        let request = to_client(request, &cx.peer, server)?;
        let asker = Asker { session, during: None, cancel: cx.ct.clone() };
        let answer = ask(cx.peer.clone(), request, Some(cx.id.clone()), asker).await?;
        let answer = serde_json::to_value(answer)
            .map_err(|e| ErrorData::internal_error(format!("the client's answer cannot be passed on: {e}"), None))?;
        answers.insert(key.clone(), answer);
    }
    Ok(answers)
}
