//! The MCP server a client connects to: lists come from the catalogue, requests are
//! routed to the server that owns the name, and a routed tool call always ends in a
//! result, never in a JSON-RPC error.

// Logging and subscriptions are deprecated by 2026-07-28 (SEP-2577) but live in every
// revision the gateway speaks.
#![allow(deprecated)]

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, ClientNotification, ClientRequest,
    CompleteRequest, CompleteRequestParams, CompleteResult, CustomNotification, GetPromptRequestParams,
    GetPromptResponse, Implementation, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, PromptsCapability, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ResourcesCapability, ServerCapabilities, ServerResult, SetLevelRequestParams,
    SubscribeRequestParams, ToolsCapability, UnsubscribeRequestParams,
};
use rmcp::model::{ResultType, SubscriptionFilter};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use rmcp::model::{InitializeRequestParams, InitializeResult, ReadResourceResult, ResourceContents};

use super::answered::{answered, unpanicked, until_cancelled};
use super::call::{Tasks, request_meta};
use super::downstreams::{Front, Reach, Subscription};
use super::forward::{Instance, Out, upstream_error};
use super::held::{self, Call, Response, Resumable, What};
use super::hub::{Hub, offered_modern};
use super::input::{self, Answer};
use super::onward;
use super::session_servers::SessionServers;
use super::status;
use crate::config::Scope;
use crate::recovery::Failure;
use crate::transport::Session;
use crate::transport::listen::{Follower, MAX_FOLLOWED, MAX_FOLLOWED_PER_CLIENT};
use crate::transport::tasks::ClientTasks;

/// One downstream session's handler. Cheap to clone; the state lives in the [`Hub`] and
/// the session's [`SessionServers`].
#[derive(Clone)]
pub struct Gateway {
    pub(super) hub: Arc<Hub>,
    /// The servers this session reaches; its name is the session's in the errors log.
    pub(super) own: Arc<SessionServers>,
}

impl Gateway {
    pub fn new(hub: Arc<Hub>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        // Names storage kept after the session (`${REBOUND_SESSION}`): unique across
        // restarts and replicas too, not only within this process and its clock.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let session: Arc<str> = format!("sess_{millis}_{n}_{:016x}", rand::random::<u64>()).into();
        // The stdio client is one for the gateway's life, and reads its own view whether it
        // initialises or not (2026-07-28); over HTTP, a client that opens a session does.
        if hub.downstreams.front() == Front::Stdio {
            hub.errors.open_view(&session);
        }
        Self { own: SessionServers::new(hub.clone(), session), hub }
    }

    /// The instance of `server` this session's requests go to, with its live session,
    /// waiting up to `within` for one.
    pub(super) async fn upstream(&self, server: &str, within: Duration) -> Result<Instance, ErrorData> {
        self.upstream_for(server, None, within).await
    }

    /// [`Gateway::upstream`] for a request `method` that, when its server is not running,
    /// the errors log has (`prompts/get`, `resources/read`, `completion/complete`). The
    /// instance is held from here for as long as the request lives ([`Instance::held`]);
    /// one that a reload replaced while the request waited for it (restarting) is not
    /// started again, and the request waits for its successor instead.
    pub(super) async fn upstream_for(
        &self,
        server: &str,
        method: Option<&str>,
        within: Duration,
    ) -> Result<Instance, ErrorData> {
        let pin = |instance| self.hub.routing.pins.count(instance);
        match self.own.ready(server, || self.own.server(server), pin, within).await {
            Ok((handle, held, session)) => {
                Ok(Instance { instance: handle.instance, session, held: Some(Arc::new(held)) })
            }
            Err(None) => Err(ErrorData::internal_error(format!("no server `{server}`"), None)),
            Err(Some(nr)) => {
                let failure = Failure::Unavailable { status: nr.status, reason: nr.last_error };
                if let Some(method) = method {
                    self.request_failed(server, method, &failure);
                }
                Err(ErrorData::internal_error(format!("server `{server}`: {}", failure.message()), None))
            }
        }
    }

    fn wait_for(&self, server: &str) -> Duration {
        self.limits(server).timeout
    }

    /// How long a request to `server` other than a tool call may take, from now: each
    /// round its `recovery.timeout_ms`, all rounds with the client's answers its call
    /// deadline.
    pub(super) fn limits(&self, server: &str) -> input::Limits {
        let (timeout, deadline) = self.times(server, "");
        input::Limits { timeout, deadline, until: tokio::time::Instant::now() + deadline }
    }

    /// `server`'s `recovery.timeout_ms` and its deadline for a call of `tool` (`""` for
    /// a request other than a tool call); 30 s each for a server not configured.
    fn times(&self, server: &str, tool: &str) -> (Duration, Duration) {
        let setup = self.hub.setup();
        let timeout = setup.config.servers.get(server).map_or(30_000, |s| s.recovery.timeout_ms);
        let deadline = setup.config.deadline_for(server, tool).unwrap_or(30_000);
        (Duration::from_millis(timeout), Duration::from_millis(deadline))
    }
}

/// A [`Gateway`] as the rmcp service of the stdio client: rmcp's dispatch, after the one
/// wait it leaves no room for. rmcp decides a `subscriptions/listen` request's
/// acknowledgement in a synchronous hook, before any handler runs; waiting here for the
/// servers' first start (bounded by `startup_timeout_ms`) lets that acknowledgement, and
/// the listens upstream, see their resources. (Over HTTP, rmcp takes only a
/// `ServerHandler`; `http::settle_listen` waits there.) It also shows a client on
/// 2025-11-25 each tool's task support, which rmcp's `Tool` cannot carry.
pub struct GatewayService(Gateway);

impl Gateway {
    /// What of `requested` a `subscriptions/listen` request is acknowledged with.
    fn subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        // Every list change, and updates of the resources asked for whose server takes
        // subscriptions (at most `MAX_LISTENED`, each once, and no more of one server than
        // a client's share of it): the acknowledgement says which.
        let catalogue = self.own.catalogue();
        let mut uris: Vec<String> = Vec::new();
        // Per server: how many taken, of how many this client may have.
        let mut per_server: std::collections::HashMap<String, (usize, usize)> = std::collections::HashMap::new();
        for uri in requested.resource_subscriptions.iter().flatten() {
            if uris.len() == MAX_LISTENED {
                break;
            }
            // (One past the bound would be refused as it is followed.)
            if uri.len() > MAX_SUBSCRIBED_URI {
                continue;
            }
            let Some((server, _)) = catalogue.resource(uri) else { continue };
            if uris.contains(uri) || !self.subscribable(&server) {
                continue;
            }
            let (taken, share) = per_server.entry(server.to_string()).or_insert_with(|| (0, self.share(&server)));
            if taken < share {
                *taken += 1;
                uris.push(uri.clone());
            }
        }
        let mut accepted = requested.clone();
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|_| uris);
        Some(accepted)
    }

    pub fn into_service(self) -> GatewayService {
        GatewayService(self)
    }
}

impl rmcp::Service<RoleServer> for GatewayService {
    async fn handle_request(
        &self,
        request: rmcp::model::ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ServerResult, ErrorData> {
        // Every request is answered, whatever part of its handling panics (rmcp's own
        // handlers, and the steps around the gateway's, included): rmcp answers nothing
        // for a handler that panics.
        let method = crate::text::capped(request.method(), 256);
        unpanicked(&method, async move {
            // Only a request rmcp will go on to read: `ready` takes the client's
            // capabilities from it.
            if matches!(request, rmcp::model::ClientRequest::SubscriptionsListenRequest(_))
                && context.meta.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty()
            {
                // Cancelled, it is not read.
                let _ = self.0.ready(&context).await;
            }
            let tasks_revision = context.protocol_version() == Some(ProtocolVersion::V_2025_11_25);
            match rmcp::Service::handle_request(&self.0, request, context).await? {
                rmcp::model::ServerResult::ListToolsResult(list) if tasks_revision => {
                    Ok(super::tasks::with_task_support(list, &self.0.own.catalogue()))
                }
                answer => Ok(answer),
            }
        })
        .await
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        rmcp::Service::handle_notification(&self.0, notification, context).await
    }

    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::Service::get_info(&self.0)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        rmcp::Service::supported_protocol_versions(&self.0)
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        // Everything a server behind us might offer; lists may be empty.
        let mut caps = ServerCapabilities::default();
        let mut tools = ToolsCapability::default();
        tools.list_changed = Some(true);
        caps.tools = Some(tools);
        let mut prompts = PromptsCapability::default();
        prompts.list_changed = Some(true);
        caps.prompts = Some(prompts);
        let mut resources = ResourcesCapability::default();
        resources.list_changed = Some(true);
        resources.subscribe = Some(true);
        caps.resources = Some(resources);
        caps.logging = Some(Default::default());
        caps.completions = Some(Default::default());
        // MCP 2026-07-28's tasks extension, relayed (`super::tasks::relayed`); not shown
        // to older clients (`initialize`).
        caps.extensions = Some([(rmcp::model::TASKS_EXTENSION_ID.to_owned(), Default::default())].into());
        rmcp::model::ServerConfig::new(caps)
            .with_server_info(Implementation::new("rebound", env!("CARGO_PKG_VERSION")).with_title("Rebound MCP gateway"))
            .with_instructions("Rebound is a gateway in front of several MCP servers. When a tool fails, its result says what was tried and what to do next.")
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // 2026-07-28 (no `initialize`, capabilities on every request) and every revision
        // before it; see `Gateway::attach`.
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        // rmcp calls this outside any handler: a panic (a bug) refuses the request.
        let accepted = std::panic::AssertUnwindSafe(|| self.subscription_filter(requested));
        std::panic::catch_unwind(accepted).unwrap_or_else(|_| {
            tracing::error!("Rebound failed while reading a `subscriptions/listen` request (a bug); it is refused");
            None
        })
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        unpanicked("subscriptions/listen", self.answer_listen(&context)).await
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        unpanicked("initialize", self.answer_initialize(request, cx)).await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        unpanicked("tasks/get", self.relayed_get(request, &cx)).await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        unpanicked("tasks/update", self.relayed_update(request, &cx)).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        unpanicked("tasks/cancel", self.relayed_cancel(request, &cx)).await
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        unpanicked("tools/list", async {
            self.ready(&cx).await?;
            let mut tools = self.own.catalogue().tools.clone();
            if self.hub.setup().config.settings.gateway_tools {
                tools.extend(status::tools());
            }
            Ok(ListToolsResult::with_all_items(tools))
        })
        .await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // A shutdown waits for this handler, not only for its request: a client's
        // cancellation closes the request before the call has ended as cancelled. (A call
        // held for a 2026-07-28 client's answers is not waited for: its handler has
        // returned the question, and the answers could not come while the gateway drains.)
        self.hub.answering(self.route_call(request, cx)).await
    }

    /// A request rmcp could not read as one it models: MCP 2025-11-25's tasks (see
    /// `tasks`), else for a method MCP defines, `params` that do not fit: -32602 (rmcp
    /// would say -32601, "method not found").
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let method = request.method.clone();
        unpanicked(&method, self.answer_custom(request, cx)).await
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        unpanicked("prompts/list", async {
            self.ready(&cx).await?;
            Ok(ListPromptsResult::with_all_items(self.own.catalogue().prompts.clone()))
        })
        .await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if !input::client_is_asked(&cx) {
            let cancelled = cx.ct.clone();
            return answered("prompts/get", &cancelled, self.answer_prompt(request, cx)).await;
        }
        self.answer_asking(request, cx, |gateway, request, cx| {
            // Its own cancellation (the call's) ends what it waits for, as the client's does.
            Box::pin(async move {
                let cancelled = cx.ct.clone();
                answered("prompts/get", &cancelled, gateway.answer_prompt(request, cx)).await
            })
        })
        .await
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        unpanicked("resources/list", async {
            self.ready(&cx).await?;
            let mut resources = self.own.catalogue().resources.clone();
            if self.hub.setup().config.settings.gateway_tools {
                resources.extend(status::resources());
            }
            Ok(ListResourcesResult::with_all_items(resources))
        })
        .await
    }

    async fn list_resource_templates(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        unpanicked("resources/templates/list", async {
            self.ready(&cx).await?;
            Ok(ListResourceTemplatesResult::with_all_items(self.own.catalogue().templates.clone()))
        })
        .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if !input::client_is_asked(&cx) {
            let cancelled = cx.ct.clone();
            return answered("resources/read", &cancelled, self.answer_read(request, cx)).await;
        }
        self.answer_asking(request, cx, |gateway, request, cx| {
            Box::pin(async move {
                let cancelled = cx.ct.clone();
                answered("resources/read", &cancelled, gateway.answer_read(request, cx)).await
            })
        })
        .await
    }

    /// Held by the session, counted (over HTTP) against its address: a client opening
    /// more sessions gets no more of a shared server's follows.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        unpanicked("resources/subscribe", async {
            self.subscribe_to(&self.own.client, &self.counted(&cx), &request.uri, &cx.ct).await.map(drop)
        })
        .await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        unpanicked("resources/unsubscribe", self.unsubscribe_from(request, &cx)).await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        answered("completion/complete", &cx.ct, self.answer_complete(request, &cx)).await
    }

    async fn set_level(&self, request: SetLevelRequestParams, _: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        unpanicked("logging/setLevel", self.answer_set_level(request)).await
    }

    async fn on_cancelled(&self, _: CancelledNotificationParam, _: NotificationContext<RoleServer>) {
        // rmcp cancels the request's token; `attempt` and `forward` pass the cancellation
        // upstream.
    }

    async fn on_roots_list_changed(&self, cx: NotificationContext<RoleServer>) {
        let Some(_on_its_way) = self.onward("notifications/roots/list_changed", &cx) else { return };
        for session in self.concerned_sessions() {
            let _ = tokio::time::timeout(onward::SEND_WITHIN, session.peer.notify_roots_list_changed()).await;
        }
    }

    async fn on_custom_notification(&self, notification: CustomNotification, cx: NotificationContext<RoleServer>) {
        let Some(_on_its_way) = self.onward(&notification.method, &cx) else { return };
        // The status of a task the client runs for a server goes to that server connection
        // only (`super::asked_tasks`); that of no such task, nowhere.
        let status = notification.method == "notifications/tasks/status";
        let task = notification.params.as_ref().and_then(|p| p["taskId"].as_str());
        let runs = &self.hub.routing.run_by_clients;
        let concerned = || {
            let sessions = self.concerned_sessions().into_iter();
            sessions.filter(|s| !status || task.is_some_and(|id| runs.runs_for(s.id, id, &self.own.client)))
        };
        // A status can pass the client's answer that creates its task: it waits for it.
        if status && !runs.kept_soon(&self.own.client, || concerned().next().is_some()).await {
            tracing::debug!(session = %self.own.client, "a task status of no task the client runs for a server; not passed on");
            return;
        }
        for session in concerned().collect::<Vec<_>>() {
            let n = ClientNotification::CustomNotification(notification.clone());
            let _ = tokio::time::timeout(onward::SEND_WITHIN, session.peer.send_notification(n)).await;
        }
    }
}

impl Gateway {
    /// Room for this client's notification `method` on its way to its servers, or none
    /// (it is dropped, and logged): see [`onward`].
    fn onward(&self, method: &str, cx: &NotificationContext<RoleServer>) -> Option<onward::OnItsWay> {
        let address = super::http::ClientIp::of(&cx.extensions).map(super::http::address_client);
        let admitted = onward::admit(&self.own.client, address);
        if admitted.is_none() {
            // Not a warning: a client flooding would flood the log with it.
            tracing::debug!(session = %self.own.client, "a client's {} not passed on to its servers: {} of its notifications (or {} of its address's, or {} of all clients') are still on their way, held by a server not reading them", crate::text::shown(method, 64), onward::PER_CLIENT, onward::PER_ADDRESS, onward::IN_ALL);
        }
        admitted
    }

    /// A tool call, bridged to an older server's task, held for a 2026-07-28 client's
    /// answers to its server's questions, or answered.
    async fn route_call(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !input::client_is_asked(&cx) {
            return self.answer_call(request, cx).await;
        }
        // (`answer_call` and `answer_asking` answer a panic of their own.)
        if unpanicked("tools/call", async { Ok(self.bridges(&request, &cx).await) }).await? {
            return unpanicked("tools/call", self.bridge_call(request, &cx)).await;
        }
        self.answer_asking(request, cx, |gateway, request, cx| {
            Box::pin(async move { gateway.answer_call(request, cx).await })
        })
        .await
    }

    /// `request`'s subscription given up by this session: upstream with its last holder.
    async fn unsubscribe_from(
        &self,
        mut request: UnsubscribeRequestParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // Until the subscription is let go, a cancellation ends the wait; after, the
        // server is told within its timeout.
        let (subscription, server) = until_cancelled(&cx.ct, self.subscription(&request.uri)).await??;
        request.uri = subscription.uri.clone();
        self.hub.downstreams.subscribe(&self.own.client, subscription, false);
        // The server keeps the subscription while another session still has it.
        let within = self.wait_for(&server);
        let to = self.upstream(&server, within).await?;
        match self.hub.unfollow_for(&to.session, to.instance, &request.uri, &self.own.client, within).await {
            Ok(done) => done.map_err(|e| upstream_error(&server, e)),
            // The gateway holds it no longer (a new follower subscribes afresh, after this
            // request on the wire), and this client hears nothing more of it.
            Err(_) => {
                let ms = within.as_millis();
                tracing::warn!(%server, uri = %request.uri, "resources/unsubscribe: no answer within {ms} ms");
                Ok(())
            }
        }
    }

    /// A request rmcp could not read as one it models (see `on_custom_request`).
    async fn answer_custom(
        &self,
        request: rmcp::model::CustomRequest,
        cx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        if let Some(method) = request.method.strip_prefix(super::tasks::AS_SENT) {
            return self.as_sent(method, request.params, cx).await;
        }
        if let Some(answer) = self.task_request(&request.method, request.params, &cx).await {
            return answer;
        }
        let method = request.method;
        if crate::transport::malformed::CLIENT_METHODS.contains(&method.as_str()) {
            return Err(ErrorData::invalid_params(
                format!("Invalid params: the `params` of `{method}` are not what it takes"),
                None,
            ));
        }
        Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("Method not found: `{method}` is not a method this gateway serves"),
            None,
        ))
    }

    /// A completion, from the server of the prompt or resource template it completes.
    async fn answer_complete(
        &self,
        mut request: CompleteRequestParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.ready(cx).await?;
        let catalogue = self.own.catalogue();
        let server = match &mut request.r#ref {
            rmcp::model::Reference::Prompt(p) => {
                let route = catalogue
                    .prompt(&p.name)
                    .cloned()
                    .ok_or_else(|| ErrorData::invalid_params(format!("unknown prompt `{}`", p.name), None))?;
                p.name = route.name;
                route.server
            }
            rmcp::model::Reference::Resource(r) => catalogue
                .template_server(&r.uri)
                .ok_or_else(|| ErrorData::invalid_params(format!("no server offers `{}`", r.uri), None))?,
            _ => {
                return Err(ErrorData::invalid_params("unsupported completion reference", None));
            }
        };
        let limits = self.limits(&server);
        let to = self.upstream_for(&server, Some("completion/complete"), limits.timeout).await?;
        let out = Out {
            method: "completion/complete",
            request: ClientRequest::CompleteRequest(CompleteRequest::new(request)),
            meta: Some(request_meta(&to.session, cx, Tasks::No)),
            hand_over: limits.timeout,
            answer_within: Some(limits.timeout),
            logged: true,
        };
        match self.forward(&to, out, cx).await.map_err(|f| f.into_error(&server))? {
            ServerResult::CompleteResult(mut result) => {
                result.result_type = Some(ResultType::COMPLETE);
                Ok(result)
            }
            _ => {
                let reason = format!("server `{server}` answered `completion/complete` with something else");
                self.request_failed(&server, "completion/complete", &Failure::Protocol { reason: reason.clone() });
                Err(ErrorData::internal_error(reason, None))
            }
        }
    }

    /// A prompt of the server that offers it.
    async fn answer_prompt(
        &self,
        mut request: GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.ready(&cx).await?;
        let route = self
            .own
            .catalogue()
            .prompt(&request.name)
            .cloned()
            .ok_or_else(|| ErrorData::invalid_params(format!("unknown prompt `{}`", request.name), None))?;
        // The deadline counts from here: waiting for a restart in progress is part of it.
        let limits = self.limits(&route.server);
        let to = self.upstream_for(&route.server, Some("prompts/get"), limits.timeout).await?;
        request.name = route.name;
        match input::settle(self, request, &to, &cx, limits).await? {
            Answer::Done(mut result) => {
                result.result_type = Some(ResultType::COMPLETE);
                Ok(result.into())
            }
            Answer::Asked(asked) => Ok(GetPromptResponse::InputRequired(asked)),
        }
    }

    /// A resource of the server that offers it, or one of the gateway's own.
    async fn answer_read(
        &self,
        mut request: ReadResourceRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.attach(&cx);
        if self.hub.setup().config.settings.gateway_tools
            && let Some(contents) = status::read(&self.hub, &request.uri, &self.own)
        {
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        let exposed = request.uri.clone();
        let (server, uri) = self.resource(&exposed).await?;
        let limits = self.limits(&server);
        let to = self.upstream_for(&server, Some("resources/read"), limits.timeout).await?;
        request.uri = uri;
        match input::settle(self, request, &to, &cx, limits).await? {
            Answer::Done(mut result) => {
                for content in &mut result.contents {
                    rename_content(content, &exposed);
                }
                result.result_type = Some(ResultType::COMPLETE);
                Ok(result.into())
            }
            Answer::Asked(asked) => Ok(ReadResourceResponse::InputRequired(asked)),
        }
    }

    /// Answers `request` of a 2026-07-28 client, whose server, on an older revision, may
    /// ask it questions while serving it (`held`): `answer` answers it.
    async fn answer_asking<P: Resumable, R: Response>(
        &self,
        mut request: P,
        cx: RequestContext<RoleServer>,
        answer: impl FnOnce(Gateway, P, RequestContext<RoleServer>) -> BoxFuture<'static, Result<R, ErrorData>>,
    ) -> Result<R, ErrorData> {
        let what = request.what();
        // Not given up at the client's cancellation: `Held::answer` winds the call down.
        unpanicked(what.method, async {
            let (state, answers) = request.resumed();
            let call = match held::take_ours(state, answers) {
                Some((state, answers)) => self.hub.held.resume(&state, &what, &self.counted(&cx), answers)?,
                None => {
                    self.ready(&cx).await?;
                    let deadline = self.deadline_of(&what);
                    let gateway = self.clone();
                    Call::new(what.clone(), self.counted(&cx), deadline, &cx, move |cx| {
                        let answer = answer(gateway, request, cx);
                        Box::pin(async move { answer.await.map(Into::into) })
                    })
                }
            };
            let answer = self.hub.held.answer(call, &cx).await;
            answer.and_then(held::read)
        })
        .await
    }

    /// How long the request `what` may take in all: its server's deadline for it.
    fn deadline_of(&self, what: &What) -> Duration {
        let catalogue = self.own.catalogue();
        let (server, name) = match what.method {
            "tools/call" => catalogue.tool(&what.name).map(|(route, _)| (route.server.clone(), route.name.as_str())),
            "prompts/get" => catalogue.prompt(&what.name).map(|route| (route.server.clone(), "")),
            _ => catalogue.resource(&what.name).map(|(server, _)| (server, "")),
        }
        .unzip();
        self.times(server.as_deref().unwrap_or_default(), name.unwrap_or_default()).1
    }

    /// Whom a request of `cx` counts against where a client's share is bounded: over HTTP
    /// its address (a 2026-07-28 client has no session, and one with sessions may open
    /// many), over stdio the one client.
    fn counted(&self, cx: &RequestContext<RoleServer>) -> Arc<str> {
        http_address(cx).map_or_else(|| self.own.client.clone(), |ip| super::http::address_client(ip).into())
    }
}

/// Whose share a task a request of `cx` makes takes (`tasks::relayed`): over HTTP its
/// address's (a 2026-07-28 client has no session); over stdio nobody's, the gateway
/// having one client.
pub(super) fn task_owner(cx: &RequestContext<RoleServer>) -> Option<Arc<str>> {
    http_address(cx).map(|ip| super::http::address_client(ip).into())
}

/// The most resources one `subscriptions/listen` request follows.
const MAX_LISTENED: usize = 256;

/// The most a client's `initialize` (its capabilities and client information) may weigh
/// once read ([`crate::weight`]): real clients' weigh a few KiB.
pub const MAX_INITIALIZE_WEIGHT: usize = 256 << 10;

/// The longest resource URI a subscription is kept for (each is kept in the gateway, and
/// by the server, for as long as the subscription lasts).
pub const MAX_SUBSCRIBED_URI: usize = 8 << 10;

/// Ends a listen request's entry when dropped (see [`Hub::session_ended`]).
struct Ended {
    hub: Arc<Hub>,
    client: Arc<str>,
}

impl Drop for Ended {
    fn drop(&mut self) {
        // Ending upstream subscriptions takes a task; there is none to take at shutdown.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.hub.session_ended(&self.client);
        }
    }
}

/// The requests the client runs as tasks, as its front read them from its `initialize`
/// (rmcp's types drop them): over stdio in the request's extensions, over HTTP in those of
/// the HTTP request it came in.
fn client_tasks(cx: &RequestContext<RoleServer>) -> Option<ClientTasks> {
    let parts = cx.extensions.get::<axum::http::request::Parts>();
    cx.extensions.get::<ClientTasks>().or_else(|| parts?.extensions.get::<ClientTasks>()).cloned()
}

/// The address of the client whose request `cx` is, when it came over HTTP (its
/// connection's, or the one a trusted proxy names).
pub(super) fn http_address(cx: &RequestContext<RoleServer>) -> Option<std::net::IpAddr> {
    super::http::ClientIp::of(&cx.extensions)
}

impl Gateway {
    /// A 2026-07-28 client never initialises: its first request introduces it, with its
    /// capabilities in the request's `_meta`. Over stdio it is the gateway's one client
    /// and has its session-scoped servers like any other; over HTTP that revision has no
    /// sessions (each request stands alone), so it reaches the shared servers only.
    /// Either way it hears list changes only on its `subscriptions/listen` requests.
    pub(super) fn attach(&self, cx: &RequestContext<RoleServer>) {
        let modern = cx.protocol_version().is_some_and(|v| !v.has_initialize());
        if !modern || self.own.is_initialised() || self.hub.downstreams.front() == Front::Http {
            return;
        }
        let caps = offered_modern(&cx.client_capabilities().unwrap_or_default());
        self.hub.offer(&caps, None);
        let _ = self.own.initialised(cx.peer.clone(), caps, None);
    }

    /// How many resources of `server` one client may follow through the gateway (see
    /// `transport::listen`): all the gateway follows there, for the only client (stdio)
    /// or a server of its own (`scope: session`); else its share.
    fn share(&self, server: &str) -> usize {
        let setup = self.hub.setup();
        let shared = setup.config.servers.get(server).is_none_or(|s| s.scope == Scope::Shared);
        if self.hub.downstreams.front() == Front::Http && shared { MAX_FOLLOWED_PER_CLIENT } else { MAX_FOLLOWED }
    }

    /// Whether `server`'s resources can be subscribed to now: it is up and, on a revision
    /// before 2026-07-28, says it takes subscriptions (on 2026-07-28 a listen request
    /// follows a resource, and the server's acknowledgement says whether it does).
    fn subscribable(&self, server: &str) -> bool {
        let session = self.own.server(server).and_then(|h| h.state().session);
        session.and_then(|s| s.info.clone()).is_some_and(|i| {
            let resources = i.capabilities.resources.as_ref();
            (!i.protocol_version.has_initialize() && resources.is_some())
                || resources.and_then(|r| r.subscribe) == Some(true)
        })
    }

    /// Ready to answer `cx`: the client introduced, the servers' first start awaited,
    /// unless the client cancels the request first.
    pub(super) async fn ready(&self, cx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.attach(cx);
        until_cancelled(&cx.ct, self.own.settled()).await
    }

    /// Subscribes `client` (a session, or a listen request) to the resource it knows as
    /// `exposed` (of at most [`MAX_SUBSCRIBED_URI`] bytes, since it is kept as long as the
    /// subscription is): upstream, unless another client already holds that subscription. It
    /// counts against the share of `counted` (the session, or a 2026-07-28 client's
    /// address). Returns the server instance and the URI it knows. Until the
    /// subscription is recorded, `cancelled` ends the wait for its server.
    async fn subscribe_to(
        &self,
        client: &Arc<str>,
        counted: &Arc<str>,
        exposed: &str,
        cancelled: &CancellationToken,
    ) -> Result<(u64, String), ErrorData> {
        if exposed.len() > MAX_SUBSCRIBED_URI {
            let message = format!(
                "the resource URI is {} bytes, longer than the {MAX_SUBSCRIBED_URI} the gateway keeps a subscription for",
                exposed.len()
            );
            return Err(ErrorData::invalid_params(message, None));
        }
        // `to` holds the instance until the subscription is made on it.
        let (subscription, server, to) = loop {
            let chosen = async {
                let (subscription, server) = self.subscription(exposed).await?;
                Ok::<_, ErrorData>((subscription, self.upstream(&server, self.wait_for(&server)).await?, server))
            };
            let (mut subscription, to, server) = until_cancelled(cancelled, chosen).await??;
            subscription.instance = to.instance;
            // Recorded first, so that an unsubscribe (or the client's end) while it is
            // being made takes the record back, which is seen below. A client gone:
            // nothing to do.
            if !self.hub.downstreams.subscribe(client, subscription.clone(), true) {
                return Ok((subscription.instance, subscription.uri));
            }
            // A reload that replaced the instance since moved its subscriptions to the
            // new one, without this: it is made there instead. (Recorded before such a
            // move, it moves with the rest.)
            if !self.own.replaced(&server, to.instance) {
                break (subscription, server, to);
            }
            self.hub.downstreams.subscribe(client, subscription, false);
        };
        let within = self.wait_for(&server);
        let (instance, uri) = (subscription.instance, subscription.uri.clone());
        // A client's share of a shared server's follows is half its room: an IPv6 site's
        // addresses together take no more.
        let who =
            Follower { holder: client.clone(), client: super::http::site_of(counted), share: self.share(&server) };
        let followed = self.hub.follow_for(&to.session, &who, instance, &uri, within).await.unwrap_or_else(|_| {
            let message = format!("server `{server}` did not answer within {} ms", within.as_millis());
            Err(rmcp::ServiceError::McpError(ErrorData::internal_error(message, None)))
        });
        if let Err(e) = followed {
            self.hub.downstreams.subscribe(client, subscription, false);
            return Err(upstream_error(&server, e));
        }
        Ok((instance, uri))
    }

    /// The server of the resource a client knows as `uri`, and the URI that server knows.
    async fn resource(&self, uri: &str) -> Result<(Arc<str>, String), ErrorData> {
        self.own.settled().await;
        self.own
            .catalogue()
            .resource(uri)
            .ok_or_else(|| ErrorData::resource_not_found(format!("no server offers `{uri}`"), None))
    }

    /// The subscription to the resource a client knows as `exposed`, and its server.
    async fn subscription(&self, exposed: &str) -> Result<(Subscription, Arc<str>), ErrorData> {
        let (server, uri) = self.resource(exposed).await?;
        let handle =
            self.own.server(&server).ok_or_else(|| ErrorData::internal_error(format!("no server `{server}`"), None))?;
        Ok((Subscription { instance: handle.instance, uri, exposed: exposed.to_owned() }, server))
    }

    /// The live upstream sessions that hear what this client says of itself (its roots,
    /// its custom notifications): its own instances, and the shared servers only when it
    /// is the gateway's one client (stdio); over HTTP they are not offered roots.
    fn concerned_sessions(&self) -> Vec<Arc<Session>> {
        let handles = match self.hub.downstreams.front() {
            Front::Stdio => self.own.all(),
            Front::Http => self.own.own_instances(),
        };
        handles.iter().filter_map(|h| h.state().session.filter(|s| s.is_live())).collect()
    }
}

/// Names a resource's contents as the client asked for it (a `rebound://via/` URI stays
/// one in the answer).
fn rename_content(content: &mut ResourceContents, exposed: &str) {
    match content {
        ResourceContents::TextResourceContents { uri, .. } | ResourceContents::BlobResourceContents { uri, .. }
            if exposed.starts_with(super::catalogue::VIA) && exposed.ends_with(uri.as_str()) =>
        {
            *uri = exposed.to_owned();
        }
        _ => {}
    }
}

impl Gateway {
    /// `subscriptions/listen`, within `unpanicked`.
    async fn answer_listen(&self, context: &SubscriptionContext) -> Result<(), ErrorData> {
        let cx = context.request_context();
        self.attach(cx);
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let listen: Arc<str> = format!("{} listen {}", self.own.client, NEXT.fetch_add(1, Ordering::Relaxed)).into();
        // A client on 2026-07-28 has no session over HTTP: its listen requests count
        // together by its address, as its requests in flight do (`http::limits`).
        let counted = self.counted(cx);
        let reach = Reach::Listen { sink: context.sink().clone(), open: cx.ct.clone() };
        self.hub.downstreams.add_listen(listen.clone(), self.own.client.clone(), counted.clone(), reach);
        // However the request ends (rmcp may drop this future when it is cancelled), its
        // entry goes, and the upstream subscriptions only it held end.
        let _ended = Ended { hub: self.hub.clone(), client: listen.clone() };
        let subscribe = async {
            for uri in context.accepted().resource_subscriptions.iter().flatten() {
                match self.subscribe_to(&listen, &counted, uri, &cx.ct).await {
                    // rmcp acknowledged the listen before this ran: what changed in
                    // between was not heard, so the client is told to read it afresh.
                    Ok((instance, uri)) => self.hub.downstreams.announce(&listen, instance, &uri),
                    // Cancelled: the rest are not followed either, nor logged one by one.
                    Err(_) if cx.ct.is_cancelled() => break,
                    Err(e) => {
                        tracing::info!(session = %self.own.client, %uri, "a listen request's resource cannot be followed: {}", e.message);
                    }
                }
            }
        };
        // Open until the client cancels it, or the gateway shuts down.
        let open = async {
            tokio::select! {
                () = context.cancelled() => {}
                () = self.hub.closing().cancelled() => {}
            }
        };
        tokio::select! {
            () = subscribe => open.await,
            () = context.cancelled() => {}
            () = self.hub.closing().cancelled() => {}
        }
        Ok(())
    }

    /// `initialize`, within `unpanicked`.
    async fn answer_initialize(
        &self,
        request: InitializeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // Kept for the session's life (by rmcp too, and offered to its own servers): a
        // client's `initialize` is bounded by what it weighs once read, not only by the
        // body it came in, whose weight is let go of once it is answered.
        let weight = crate::weight::json(&serde_json::to_vec(&request).unwrap_or_default());
        if weight > MAX_INITIALIZE_WEIGHT {
            let message = format!(
                "the initialize request's capabilities and client information weigh {weight} bytes once read, past the {MAX_INITIALIZE_WEIGHT} the gateway keeps for a session"
            );
            return Err(ErrorData::invalid_params(message, None));
        }
        // Once per session, first: a second would leave the first's subscriptions behind
        // for good, held on shared servers against the client's address.
        let tasks = client_tasks(&cx);
        if !self.own.initialised(cx.peer.clone(), request.capabilities.clone(), tasks.clone()) {
            let message = "this session has been initialised already: `initialize` comes once, first; open a new session to start again";
            return Err(ErrorData::invalid_request(message, None));
        }
        cx.peer.set_peer_info(request.clone());
        if self.hub.downstreams.front() == Front::Stdio {
            self.hub.offer(&request.capabilities, tasks.clone());
        }
        // Here, not at `notifications/initialized`: rmcp handles that notification on a
        // task of its own, which the client's first requests can overtake.
        let ip = http_address(&cx);
        if ip.is_some() {
            let _ = self.own.blamed.set(super::tool_call::blame_of(Some(&self.own.client), ip));
        }
        let address = ip.map(|ip| super::http::address_client(ip).into());
        self.hub.downstreams.add(self.own.client.clone(), cx.peer.clone(), address);
        self.hub.errors.open_view(&self.own.client);
        let mut answer = self.negotiate_initialize(&request)?;
        answer.capabilities.extensions = None;
        Ok(answer)
    }

    /// `logging/setLevel`, within `unpanicked`.
    async fn answer_set_level(&self, request: SetLevelRequestParams) -> Result<(), ErrorData> {
        let downstreams = &self.hub.downstreams;
        downstreams.set_level(&self.own.client, request.level);
        // Shared servers log at the most verbose level any session asked for
        // (`Downstreams::level`); each session hears only what its own level lets
        // through, of its own calls. Asked only when that is not what every shared server
        // last took: a server (re)started meanwhile is set as it becomes ready
        // (`Hub::on_ready`).
        let shared = downstreams.level(None).unwrap_or(request.level);
        let unchanged = downstreams.shared_level() == Some(shared);
        let shared_instances = if unchanged { Vec::new() } else { self.hub.shared_instances() };
        let own = self.own.own_instances();
        let levels = own.iter().map(|h| (h, request.level, false));
        let levels = levels.chain(shared_instances.iter().map(|h| (h, shared, true)));
        // All at once, each within its server's `recovery.timeout_ms`: a server that does
        // not answer holds up neither the others nor the client.
        let set = levels.filter_map(|(handle, level, is_shared)| {
            let session = handle.state().session.filter(|s| s.is_live())?;
            session.info.as_ref().is_some_and(|i| i.capabilities.logging.is_some()).then_some(())?;
            let within = self.limits(&handle.name).timeout;
            Some(async move {
                // Every session's level, on a shared server: what it says meanwhile is no
                // one client's.
                let set = session.peer.set_level(SetLevelRequestParams::new(level));
                let took = match self.hub.aside(handle.instance, within, set).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        tracing::debug!(server = %handle.name, "logging/setLevel failed: {e}");
                        false
                    }
                    Err(_) => {
                        let within = within.as_millis();
                        tracing::debug!(server = %handle.name, "logging/setLevel: no answer within {within} ms");
                        false
                    }
                };
                took || !is_shared
            })
        });
        let took = futures::future::join_all(set).await;
        if !unchanged {
            // One that did not take it is asked again at the next `logging/setLevel`.
            downstreams.took_shared_level(took.iter().all(|t| *t).then_some(shared));
        }
        Ok(())
    }
}
