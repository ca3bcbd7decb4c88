//! The merged catalogue: every server's tools, prompts, resources and templates under one
//! roof, named per `tool_names`, with the route back to the server that owns each.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rmcp::model::{Prompt, Resource, ResourceTemplate, ServerNotification, Tool};

use crate::config::ToolNames;
use crate::transport::supervisor::Listing;
use crate::transport::tasks::TaskSupport;

/// Where an exposed name leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub server: Arc<str>,
    /// The name the server knows it by.
    pub name: String,
}

/// One immutable snapshot, rebuilt whenever a server's listing or state changes.
#[derive(Debug, Default)]
pub struct Catalogue {
    pub tools: Vec<Tool>,
    pub prompts: Vec<Prompt>,
    pub resources: Vec<Resource>,
    pub templates: Vec<ResourceTemplate>,
    tool_routes: HashMap<String, (Route, Tool)>,
    /// Exposed tool name → the task support its server listed (MCP 2025-11-25).
    task_support: HashMap<String, TaskSupport>,
    prompt_routes: HashMap<String, Route>,
    /// Exposed URI → (server, the URI it knows).
    resource_routes: HashMap<String, (Arc<str>, String)>,
    /// URIs more than one server listed: (URI, the server that keeps it, the other).
    collisions: HashSet<(String, Arc<str>, Arc<str>)>,
    /// Resources and templates a server listed under the gateway's own [`OWN_SCHEME`],
    /// left out: (server, URI or template).
    trespasses: HashSet<(Arc<str>, String)>,
    /// (literal prefix of the template, server), longest prefix first.
    template_routes: Vec<(String, Arc<str>)>,
    /// Names of servers that have resources, for URIs nobody listed.
    resource_servers: Vec<Arc<str>>,
}

/// The most colliding resource URIs named in the log at one change; the rest are counted.
const MAX_COLLISIONS_SAID: usize = 10;

/// The separator of prefixed names, `server__tool`.
pub const SEPARATOR: &str = "__";

/// A resource URI that an earlier server (in configuration order) also lists is exposed
/// under this prefix, the server's name and a slash: `rebound://via/SERVER/URI`.
pub const VIA: &str = "rebound://via/";

/// The gateway's own URIs (its resources, `rebound://status`, and the names of [`VIA`]):
/// a server's resource or template under it is left out, so that no server can answer
/// for the gateway, or for another server under the name the gateway gives it.
pub const OWN_SCHEME: &str = "rebound://";

/// The gateway's own tools' names, which no server's tool takes: under `conditional`
/// naming a server's tool of that name is prefixed, as if another server had it too.
const OWN_TOOLS: [&str; 2] = [super::status::STATUS_TOOL, super::status::RESET_TOOL];

impl Catalogue {
    /// Merges `listings` (in configuration order) under the naming `policy`.
    pub fn build(listings: &[(Arc<str>, Arc<Listing>)], policy: ToolNames) -> Self {
        let mut cat = Catalogue::default();
        let tool_names =
            exposed_names(listings, policy, &OWN_TOOLS, |l| l.tools.iter().map(|t| t.name.as_ref()).collect());
        let prompt_names =
            exposed_names(listings, policy, &[], |l| l.prompts.iter().map(|p| p.name.as_str()).collect());
        for ((server, listing), (tools, prompts)) in listings.iter().zip(tool_names.into_iter().zip(prompt_names)) {
            for (tool, exposed) in listing.tools.iter().zip(tools) {
                let Some(exposed) = exposed else { continue };
                let mut t = tool.clone();
                t.name = exposed.clone().into();
                if let Some(support) = listing.task_support.get(tool.name.as_ref()) {
                    cat.task_support.insert(exposed.clone(), *support);
                }
                cat.tool_routes
                    .insert(exposed, (Route { server: server.clone(), name: tool.name.to_string() }, tool.clone()));
                cat.tools.push(t);
            }
            for (prompt, exposed) in listing.prompts.iter().zip(prompts) {
                let Some(exposed) = exposed else { continue };
                let mut p = prompt.clone();
                p.name = exposed.clone();
                cat.prompt_routes.insert(exposed, Route { server: server.clone(), name: prompt.name.clone() });
                cat.prompts.push(p);
            }
            // URIs are global names already; the first server to list one keeps it, and a
            // later one's is reachable under `VIA`.
            for resource in &listing.resources {
                if resource.uri.starts_with(OWN_SCHEME) {
                    cat.trespasses.insert((server.clone(), resource.uri.clone()));
                    continue;
                }
                let mut exposed = resource.clone();
                if let Some((first, _)) = cat.resource_routes.get(&resource.uri) {
                    if first == server {
                        continue; // listed twice by the same server: once is enough
                    }
                    cat.collisions.insert((resource.uri.clone(), first.clone(), server.clone()));
                    exposed.uri = format!("{VIA}{server}/{}", resource.uri);
                }
                if !cat.resource_routes.contains_key(&exposed.uri) {
                    cat.resource_routes.insert(exposed.uri.clone(), (server.clone(), resource.uri.clone()));
                    cat.resources.push(exposed);
                }
            }
            for template in &listing.templates {
                if template.uri_template.starts_with(OWN_SCHEME) {
                    cat.trespasses.insert((server.clone(), template.uri_template.clone()));
                    continue;
                }
                let prefix = template.uri_template.split('{').next().unwrap_or_default().to_owned();
                cat.template_routes.push((prefix, server.clone()));
                cat.templates.push(template.clone());
            }
            if !listing.resources.is_empty() || !listing.templates.is_empty() {
                // (A server whose every resource is the gateway's would still take URIs
                // nobody lists, as the only server with resources; never the gateway's.)
                cat.resource_servers.push(server.clone());
            }
        }
        cat.template_routes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        cat
    }

    /// The route of an exposed tool name, with the tool as its server published it.
    pub fn tool(&self, name: &str) -> Option<&(Route, Tool)> {
        self.tool_routes.get(name)
    }

    /// The task support of an exposed tool, where its server listed one.
    pub fn task_support(&self, name: &str) -> Option<TaskSupport> {
        self.task_support.get(name).copied()
    }

    /// Whether any tool listed a task support.
    pub fn has_task_support(&self) -> bool {
        !self.task_support.is_empty()
    }

    pub fn prompt(&self, name: &str) -> Option<&Route> {
        self.prompt_routes.get(name)
    }

    /// The server that serves `uri`, and the URI it knows: the one that listed it, else
    /// the one whose template matches it best, else the only server with resources.
    pub fn resource(&self, uri: &str) -> Option<(Arc<str>, String)> {
        if let Some(route) = self.resource_routes.get(uri) {
            return Some(route.clone());
        }
        if uri.starts_with(OWN_SCHEME) {
            return None;
        }
        let server = self
            .template_routes
            .iter()
            .find(|(prefix, _)| !prefix.is_empty() && uri.starts_with(prefix.as_str()))
            .map(|(_, s)| s)
            .or(match self.resource_servers.as_slice() {
                [only] => Some(only),
                _ => None,
            })?;
        Some((server.clone(), uri.to_owned()))
    }

    /// The URI a client knows for `server`'s `uri` (see [`VIA`]).
    pub fn exposed_uri(&self, server: &str, uri: &str) -> String {
        match self.resource_routes.get(uri) {
            Some((owner, _)) if &**owner != server => format!("{VIA}{server}/{uri}"),
            _ => uri.to_owned(),
        }
    }

    /// The server of a resource template, for completions.
    pub fn template_server(&self, uri_template: &str) -> Option<Arc<str>> {
        let prefix = uri_template.split('{').next().unwrap_or_default();
        self.template_routes
            .iter()
            .find(|(p, _)| p == prefix)
            .map(|(_, s)| s.clone())
            .or_else(|| self.resource(uri_template).map(|(s, _)| s))
    }

    /// Whether the exposed tool lists differ (names, schemas, annotations or task support).
    pub fn tools_differ(&self, other: &Catalogue) -> bool {
        self.tools != other.tools || self.task_support != other.task_support
    }

    pub fn prompts_differ(&self, other: &Catalogue) -> bool {
        self.prompts != other.prompts
    }

    pub fn resources_differ(&self, other: &Catalogue) -> bool {
        self.resources != other.resources || self.templates != other.templates
    }

    /// The `list_changed` notifications that tell a client this catalogue became `next`
    /// (tools always, with `force`).
    pub fn changes(&self, next: &Catalogue, force: bool) -> Vec<ServerNotification> {
        let mut out = Vec::new();
        if force || next.tools_differ(self) {
            out.push(ServerNotification::ToolListChangedNotification(Default::default()));
        }
        if next.prompts_differ(self) {
            out.push(ServerNotification::PromptListChangedNotification(Default::default()));
        }
        if next.resources_differ(self) {
            out.push(ServerNotification::ResourceListChangedNotification(Default::default()));
        }
        let new: Vec<_> = next.collisions.iter().filter(|c| !self.collisions.contains(*c)).collect();
        for (uri, first, other) in new.iter().take(MAX_COLLISIONS_SAID) {
            tracing::warn!(
                "`{first}` and `{other}` both list the resource {uri}: `{other}`'s is reachable as {VIA}{other}/{uri}"
            );
        }
        if let Some(more) = new.len().checked_sub(MAX_COLLISIONS_SAID).filter(|n| *n > 0) {
            tracing::warn!("and {more} more resource URIs listed by two servers, each reachable as {VIA}SERVER/URI");
        }
        let trespasses: Vec<_> = next.trespasses.iter().filter(|t| !self.trespasses.contains(*t)).collect();
        for (server, uri) in trespasses.iter().take(MAX_COLLISIONS_SAID) {
            tracing::warn!(server = %server, "`{uri}` is left out: {OWN_SCHEME} URIs are the gateway's own");
        }
        if let Some(more) = trespasses.len().checked_sub(MAX_COLLISIONS_SAID).filter(|n| *n > 0) {
            tracing::warn!("and {more} more {OWN_SCHEME} resources or templates of servers, left out");
        }
        out
    }
}

/// For each server, the exposed name of each of its items (`None`: hidden, because the
/// policy is `never` and an earlier server, or the gateway (`own`), has the name, or
/// another server's item has it prefixed). A prefixed name (`server__tool`) is its server's before any listed name: a
/// server listing `github__create_issue` itself cannot take the name of `github`'s
/// `create_issue`, which a collision has prefixed.
fn exposed_names<'a>(
    listings: &'a [(Arc<str>, Arc<Listing>)],
    policy: ToolNames,
    own: &[&'a str],
    names: impl Fn(&'a Listing) -> Vec<&'a str>,
) -> Vec<Vec<Option<String>>> {
    let per_server: Vec<Vec<&str>> = listings.iter().map(|(_, l)| names(l)).collect();
    let mut owners: HashMap<&str, usize> = own.iter().map(|name| (*name, 1)).collect();
    for list in &per_server {
        for name in list {
            *owners.entry(name).or_default() += 1;
        }
    }
    let wanted: Vec<Vec<(String, bool)>> = listings
        .iter()
        .zip(&per_server)
        .map(|((server, _), list)| {
            list.iter()
                .map(|name| {
                    let prefixed = match policy {
                        ToolNames::Always => true,
                        ToolNames::Conditional => owners[name] > 1,
                        ToolNames::Never => false,
                    };
                    let exposed = if prefixed { format!("{server}{SEPARATOR}{name}") } else { (*name).to_owned() };
                    (exposed, prefixed)
                })
                .collect()
        })
        .collect();
    let mut exposed: Vec<Vec<Option<String>>> = wanted.iter().map(|list| vec![None; list.len()]).collect();
    let mut taken: HashSet<&str> = own.iter().copied().collect();
    // The prefixed names first, then the rest, each in the configuration's order.
    for prefixed_pass in [true, false] {
        for (s, list) in wanted.iter().enumerate() {
            for (i, (name, prefixed)) in list.iter().enumerate() {
                if *prefixed != prefixed_pass {
                    continue;
                }
                if taken.insert(name) {
                    exposed[s][i] = Some(name.clone());
                } else {
                    let server = &listings[s].0;
                    let by = if own.contains(&name.as_str()) { "the gateway itself" } else { "another server" };
                    tracing::warn!(server = %server, "`{name}` is already served by {by}; this one is hidden");
                }
            }
        }
    }
    exposed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(tools: &[&str]) -> Arc<Listing> {
        Arc::new(Listing {
            tools: tools.iter().map(|n| Tool::new(n.to_string(), "d", Arc::new(Default::default()))).collect(),
            ..Listing::default()
        })
    }

    fn names(policy: ToolNames) -> Vec<String> {
        let servers = [("a".into(), listing(&["echo", "add"])), ("b".into(), listing(&["echo", "mul"]))];
        Catalogue::build(&servers, policy).tools.iter().map(|t| t.name.to_string()).collect()
    }

    #[test]
    fn conditional_prefixes_only_collisions() {
        assert_eq!(names(ToolNames::Conditional), ["a__echo", "add", "b__echo", "mul"]);
    }

    #[test]
    fn always_prefixes_everything() {
        assert_eq!(names(ToolNames::Always), ["a__echo", "a__add", "b__echo", "b__mul"]);
    }

    #[test]
    fn never_keeps_the_first_owner() {
        assert_eq!(names(ToolNames::Never), ["echo", "add", "mul"]);
    }

    /// A server listing another's prefixed name itself, ahead of it in the
    /// configuration, cannot take it: the call goes to the server the prefix names.
    #[test]
    fn a_listed_name_cannot_take_another_servers_prefixed_one() {
        let servers = [
            ("m".into(), listing(&["create_issue", "github__create_issue"])),
            ("github".into(), listing(&["create_issue"])),
        ];
        let cat = Catalogue::build(&servers, ToolNames::Conditional);
        let (route, _) = cat.tool("github__create_issue").unwrap();
        assert_eq!((&*route.server, route.name.as_str()), ("github", "create_issue"));
        let names: Vec<&str> = cat.tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, ["m__create_issue", "github__create_issue"], "m's own is hidden");
    }

    /// A server's tool named as one of the gateway's own is prefixed (`conditional`), or
    /// hidden (`never`): the name stays the gateway's, and so do its calls.
    #[test]
    fn the_gateways_own_tool_names_stay_its_own() {
        let servers = [("s".into(), listing(&["rebound_status", "rebound_reset_breaker", "echo"]))];
        let names = |policy| -> Vec<String> {
            Catalogue::build(&servers, policy).tools.iter().map(|t| t.name.to_string()).collect()
        };
        assert_eq!(names(ToolNames::Conditional), ["s__rebound_status", "s__rebound_reset_breaker", "echo"]);
        assert_eq!(names(ToolNames::Never), ["echo"]);
        let cat = Catalogue::build(&servers, ToolNames::Conditional);
        assert!(cat.tool("rebound_status").is_none() && cat.tool("s__rebound_status").is_some());
    }

    /// A server's resources and templates under `rebound://` are left out: it can neither
    /// answer for the gateway's own nor take the name the gateway gives another server's.
    #[test]
    fn no_server_takes_the_gateways_own_uris() {
        let listing = |uris: &[&str], template: Option<&str>| {
            let mut l = Listing::default();
            l.resources.extend(uris.iter().map(|uri| Resource::new(*uri, "r")));
            l.templates.extend(template.map(|t| ResourceTemplate::new(t, "t")));
            Arc::new(l)
        };
        let servers = [
            ("a".into(), listing(&["file:///x"], None)),
            ("h".into(), listing(&["rebound://via/b/file:///x", "rebound://status"], Some("rebound://{x}"))),
            ("b".into(), listing(&["file:///x"], None)),
        ];
        let cat = Catalogue::build(&servers, ToolNames::Conditional);
        let uris: Vec<&str> = cat.resources.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, ["file:///x", "rebound://via/b/file:///x"]);
        assert_eq!(cat.resource("rebound://via/b/file:///x"), Some(("b".into(), "file:///x".into())));
        assert!(cat.templates.is_empty());
        assert_eq!((cat.resource("rebound://status"), cat.resource("rebound://other")), (None, None));
        assert_eq!(cat.trespasses.len(), 3);
        // Nor does the only server with resources take the gateway's URIs nobody lists.
        let only = [("h".into(), listing(&["rebound://status", "file:///y"], None))];
        let cat = Catalogue::build(&only, ToolNames::Conditional);
        assert_eq!(cat.resource("file:///z"), Some(("h".into(), "file:///z".into())));
        assert_eq!(cat.resource("rebound://status"), None);
    }

    #[test]
    fn routes_lead_back_to_the_original_name() {
        let servers = [("a".into(), listing(&["echo"])), ("b".into(), listing(&["echo"]))];
        let cat = Catalogue::build(&servers, ToolNames::Conditional);
        let (route, tool) = cat.tool("b__echo").unwrap();
        assert_eq!((&*route.server, route.name.as_str(), tool.name.as_ref()), ("b", "echo", "echo"));
        assert!(cat.tool("echo").is_none());
    }

    #[test]
    fn resources_route_by_uri_then_template() {
        let mut a = Listing::default();
        a.resources.push(Resource::new("file:///a", "a"));
        let mut b = Listing::default();
        b.templates.push(ResourceTemplate::new("db://rows/{id}", "row"));
        let cat = Catalogue::build(&[("a".into(), Arc::new(a)), ("b".into(), Arc::new(b))], ToolNames::Conditional);
        let server = |uri: &str| cat.resource(uri).map(|(s, _)| s.to_string());
        assert_eq!(server("file:///a").as_deref(), Some("a"));
        assert_eq!(server("db://rows/7").as_deref(), Some("b"));
        assert_eq!(server("nope://x"), None);
    }

    #[test]
    fn a_uri_two_servers_list_is_reachable_on_both() {
        let listing = |uri: &str| {
            let mut l = Listing::default();
            l.resources.push(Resource::new(uri, "r"));
            Arc::new(l)
        };
        let servers = [("a".into(), listing("file:///x")), ("b".into(), listing("file:///x"))];
        let cat = Catalogue::build(&servers, ToolNames::Conditional);
        let uris: Vec<&str> = cat.resources.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, ["file:///x", "rebound://via/b/file:///x"]);
        assert_eq!(cat.resource("file:///x"), Some(("a".into(), "file:///x".into())));
        assert_eq!(cat.resource("rebound://via/b/file:///x"), Some(("b".into(), "file:///x".into())));
        assert_eq!(cat.exposed_uri("b", "file:///x"), "rebound://via/b/file:///x");
        assert_eq!(cat.exposed_uri("a", "file:///x"), "file:///x");
        assert_eq!(cat.collisions, HashSet::from([("file:///x".into(), "a".into(), "b".into())]));
        // One server listing a URI twice, or many times: once, and no collision.
        let mut twice = Listing::default();
        twice.resources.extend((0..1000).map(|i| Resource::new(format!("file:///{}", i % 2), "r")));
        let cat = Catalogue::build(&[("a".into(), Arc::new(twice))], ToolNames::Conditional);
        assert_eq!((cat.resources.len(), cat.collisions.len()), (2, 0));
    }
}
