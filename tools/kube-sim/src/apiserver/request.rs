//! Parsing an API request: which resource a path addresses, which verb a
//! method means, and the query parameters the handlers read.

use std::collections::HashMap;

use axum::http::{Method, Uri};

use super::protobuf;
use crate::errors::ApiError;
use crate::kinds::{self, RESOURCES, ResourceId};
use crate::storage::registry::{DeleteOptions, Propagation};

/// A resource path: `/api/v1/namespaces/<ns>/pods/<name>/<sub>` and friends.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourcePath {
    pub res: ResourceId,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub legacy_watch: bool,
}

impl ResourcePath {
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    /// The resource as counted and authorized: `pods` or `pods/log`.
    pub fn resource_label(&self) -> String {
        match &self.subresource {
            Some(s) => format!("{}/{s}", self.res.info().plural),
            None => self.res.info().plural.to_string(),
        }
    }
}

/// Parses a resource path; `None` when the path is not a resource path at
/// all (discovery and other endpoints are routed elsewhere).
pub fn parse_path(path: &str, gateway_api: bool) -> Result<ResourcePath, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let find = |plural: &str| -> Result<ResourceId, ApiError> {
        let id = kinds::find(group, plural).ok_or_else(ApiError::path_not_found)?;
        let info = id.info();
        if !info.versions.contains(&version) || (info.gateway_api && !gateway_api) {
            return Err(ApiError::path_not_found());
        }
        Ok(id)
    };
    let ns_is_parent = |rest: &[&str]| {
        group.is_empty()
            && rest.len() >= 3
            && rest[0] == "namespaces"
            && !(rest.len() == 3 && (rest[2] == "status" || rest[2] == "finalize"))
            || (!group.is_empty() && rest.len() >= 3 && rest[0] == "namespaces")
    };
    let (namespace, rest): (Option<String>, &[&str]) = if ns_is_parent(rest) {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(ApiError::path_not_found()),
    };
    let res = find(plural)?;
    let info = res.info();
    if namespace.is_some() && !info.namespaced {
        return Err(ApiError::path_not_found());
    }
    if let Some(s) = &sub
        && !info.subresources.contains(&s.as_str())
    {
        return Err(ApiError::path_not_found());
    }
    if name.as_deref() == Some("") {
        return Err(ApiError::path_not_found());
    }
    Ok(ResourcePath {
        res,
        version: version.to_string(),
        namespace,
        name,
        subresource: sub,
        legacy_watch,
    })
}

/// Query parameters, last value wins.
#[derive(Debug, Clone, Default)]
pub struct Query(pub HashMap<String, String>);

impl Query {
    pub fn from_uri(uri: &Uri) -> Self {
        let pairs: Vec<(String, String)> =
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
                .map(|q| q.0)
                .unwrap_or_default();
        Self(pairs.into_iter().collect())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true") | Some("1") | Some("")) && self.0.contains_key(key)
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {v:?}: invalid syntax"))
            }),
        }
    }

    pub fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            ))),
        }
    }
}

/// The Kubernetes verb of a request.
pub fn verb(method: &Method, path: &ResourcePath, query: &Query) -> &'static str {
    let collection = path.name.is_none();
    match *method {
        Method::GET if path.subresource.as_deref() == Some("attach") => "get",
        Method::GET if collection && (path.legacy_watch || query.flag("watch")) => "watch",
        Method::GET if !collection && path.legacy_watch => "watch",
        Method::GET if collection => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

/// `DeleteOptions` from the body (if any; JSON, or Kubernetes protobuf when
/// `content_type` says so) and the query string.
pub fn delete_options(
    query: &Query,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    let base = content_type
        .and_then(|ct| ct.split(';').next())
        .unwrap_or("")
        .trim();
    let parsed: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Null
    } else if base == protobuf::MEDIA_TYPE {
        let v = protobuf::decode(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        if v.get("kind").and_then(serde_json::Value::as_str) != Some("DeleteOptions") {
            return Err(ApiError::bad_request(format!(
                "error decoding DeleteOptions: the body is a {}",
                v.get("kind")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
            )));
        }
        v
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let from_body = |k: &str| parsed.get(k).cloned();
    opts.grace_period_seconds = match from_body("gracePeriodSeconds").and_then(|v| v.as_i64()) {
        Some(g) => Some(g),
        None => query.int("gracePeriodSeconds")?,
    };
    let propagation = from_body("propagationPolicy")
        .and_then(|v| v.as_str().map(str::to_string))
        .or_else(|| query.get("propagationPolicy").map(str::to_string));
    opts.propagation = match propagation.as_deref() {
        None | Some("") => None,
        Some("Orphan") => Some(Propagation::Orphan),
        Some("Background") => Some(Propagation::Background),
        Some("Foreground") => Some(Propagation::Foreground),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    };
    let orphan = from_body("orphanDependents")
        .and_then(|v| v.as_bool())
        .or_else(|| query.get("orphanDependents").map(|v| v == "true"));
    if orphan == Some(true) && opts.propagation.is_none() {
        opts.propagation = Some(Propagation::Orphan);
    }
    opts.precondition_uid = parsed
        .pointer("/preconditions/uid")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    opts.precondition_rv = parsed
        .pointer("/preconditions/resourceVersion")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let dry = parsed
        .get("dryRun")
        .and_then(|v| v.as_array())
        .is_some_and(|a| a.iter().any(|x| x == "All"));
    opts.dry_run = dry || query.dry_run()?;
    Ok(opts)
}

/// The `List` kind of a resource's list responses.
pub fn list_kind(res: ResourceId) -> String {
    format!("{}List", res.info().kind)
}

pub fn known_resources() -> usize {
    RESOURCES.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_and_cluster_paths_parse() {
        let p = parse_path("/api/v1/namespaces/ns/pods/p/log", false).expect("parses");
        assert_eq!(p.res, kinds::pods());
        assert_eq!(p.namespace.as_deref(), Some("ns"));
        assert_eq!(p.name.as_deref(), Some("p"));
        assert_eq!(p.subresource.as_deref(), Some("log"));
        let p = parse_path("/api/v1/namespaces/ns", false).expect("parses");
        assert_eq!(p.res, kinds::id("namespaces"));
        assert_eq!(p.name.as_deref(), Some("ns"));
        let p = parse_path("/api/v1/namespaces/ns/status", false).expect("parses");
        assert_eq!(p.subresource.as_deref(), Some("status"));
        let p = parse_path("/api/v1/pods", false).expect("parses");
        assert!(p.namespace.is_none() && p.name.is_none());
        let p = parse_path("/apis/networking.k8s.io/v1/ingressclasses/x", false).expect("parses");
        assert_eq!(p.res, kinds::id("ingressclasses"));
    }

    #[test]
    fn gateway_paths_need_the_flag() {
        let path = "/apis/gateway.networking.k8s.io/v1/namespaces/ns/httproutes";
        assert_eq!(parse_path(path, false).unwrap_err().code, 404);
        assert!(parse_path(path, true).is_ok());
    }

    #[test]
    fn unknown_paths_are_404() {
        assert_eq!(parse_path("/api/v1/widgets", false).unwrap_err().code, 404);
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/pods/p/exec", false)
                .unwrap_err()
                .code,
            404
        );
    }
}
