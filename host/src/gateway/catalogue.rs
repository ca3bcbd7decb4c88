//! The merged catalogue: every server's tools, prompts, resources and templates under one
//! roof, named per `tool_names`, with the route back to the server that owns each.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{Prompt, Resource, ResourceTemplate, Tool};

use crate::config::ToolNames;
use crate::transport::supervisor::Listing;

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
    prompt_routes: HashMap<String, Route>,
    resource_routes: HashMap<String, Arc<str>>,
    /// (literal prefix of the template, server), longest prefix first.
    template_routes: Vec<(String, Arc<str>)>,
    /// Names of servers that have resources, for URIs nobody listed.
    resource_servers: Vec<Arc<str>>,
}

/// The separator of prefixed names, `server__tool`.
pub const SEPARATOR: &str = "__";

impl Catalogue {
    /// Merges `listings` (in configuration order) under the naming `policy`.
    pub fn build(listings: &[(Arc<str>, Arc<Listing>)], policy: ToolNames) -> Self {
        let mut cat = Catalogue::default();
        let tool_names = exposed_names(listings, policy, |l| l.tools.iter().map(|t| t.name.as_ref()).collect());
        let prompt_names = exposed_names(listings, policy, |l| l.prompts.iter().map(|p| p.name.as_str()).collect());
        for ((server, listing), (tools, prompts)) in listings.iter().zip(tool_names.into_iter().zip(prompt_names)) {
            for (tool, exposed) in listing.tools.iter().zip(tools) {
                let Some(exposed) = exposed else { continue };
                let mut t = tool.clone();
                t.name = exposed.clone().into();
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
            // URIs are global names already; the first server to list one owns it.
            for resource in &listing.resources {
                if !cat.resource_routes.contains_key(&resource.uri) {
                    cat.resource_routes.insert(resource.uri.clone(), server.clone());
                    cat.resources.push(resource.clone());
                }
            }
            for template in &listing.templates {
                let prefix = template.uri_template.split('{').next().unwrap_or_default().to_owned();
                cat.template_routes.push((prefix, server.clone()));
                cat.templates.push(template.clone());
            }
            if !listing.resources.is_empty() || !listing.templates.is_empty() {
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

    pub fn prompt(&self, name: &str) -> Option<&Route> {
        self.prompt_routes.get(name)
    }

    /// The server that serves `uri`: the one that listed it, else the one whose template
    /// matches it best, else the only server with resources.
    pub fn resource_server(&self, uri: &str) -> Option<Arc<str>> {
        if let Some(s) = self.resource_routes.get(uri) {
            return Some(s.clone());
        }
        if let Some((_, s)) =
            self.template_routes.iter().find(|(prefix, _)| !prefix.is_empty() && uri.starts_with(prefix.as_str()))
        {
            return Some(s.clone());
        }
        match self.resource_servers.as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        }
    }

    /// The server of a resource template, for completions.
    pub fn template_server(&self, uri_template: &str) -> Option<Arc<str>> {
        let prefix = uri_template.split('{').next().unwrap_or_default();
        self.template_routes
            .iter()
            .find(|(p, _)| p == prefix)
            .map(|(_, s)| s.clone())
            .or_else(|| self.resource_server(uri_template))
    }

    /// Whether the exposed tool lists differ (names, schemas or annotations).
    pub fn tools_differ(&self, other: &Catalogue) -> bool {
        self.tools != other.tools
    }

    pub fn prompts_differ(&self, other: &Catalogue) -> bool {
        self.prompts != other.prompts
    }

    pub fn resources_differ(&self, other: &Catalogue) -> bool {
        self.resources != other.resources || self.templates != other.templates
    }
}

/// For each server, the exposed name of each of its items (`None`: hidden, because the
/// policy is `never` and an earlier server has the name).
fn exposed_names<'a>(
    listings: &'a [(Arc<str>, Arc<Listing>)],
    policy: ToolNames,
    names: impl Fn(&'a Listing) -> Vec<&'a str>,
) -> Vec<Vec<Option<String>>> {
    let per_server: Vec<Vec<&str>> = listings.iter().map(|(_, l)| names(l)).collect();
    let mut owners: HashMap<&str, usize> = HashMap::new();
    for list in &per_server {
        for name in list {
            *owners.entry(name).or_default() += 1;
        }
    }
    let mut taken: HashMap<String, ()> = HashMap::new();
    listings
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
                    if taken.insert(exposed.clone(), ()).is_some() {
                        tracing::warn!(server = %server, "`{exposed}` is already served by another server; this one is hidden");
                        None
                    } else {
                        Some(exposed)
                    }
                })
                .collect()
        })
        .collect()
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
        assert_eq!(cat.resource_server("file:///a").as_deref(), Some("a"));
        assert_eq!(cat.resource_server("db://rows/7").as_deref(), Some("b"));
        assert_eq!(cat.resource_server("nope://x"), None);
    }
}
