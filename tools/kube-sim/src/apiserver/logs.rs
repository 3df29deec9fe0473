//! `pods/log`: a container's output, whole or followed, with the
//! apiserver's errors for a missing, ambiguous or not-yet-started container.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use serde_json::Value;
use tokio::sync::mpsc;

use super::ApiContext;
use super::request::{Query, ResourcePath};
use super::watch::tokio_stream_shim::ReceiverStream;
use crate::errors::ApiError;
use crate::kubelet::streams::{ContainerStreams, LogChunk};
use crate::meta;

pub async fn handle(ctx: Arc<ApiContext>, target: ResourcePath, query: Query) -> Response {
    match start(ctx, &target, &query) {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// Which container a request names, or the apiserver's 400.
pub fn pick_container(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let name = meta::name(pod);
    let names = |g: &str| -> Vec<String> {
        meta::path(pod, g)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    let mains = names("spec.containers");
    let inits = names("spec.initContainers");
    match requested.filter(|c| !c.is_empty()) {
        Some(c) => {
            if mains.iter().chain(inits.iter()).any(|n| n == c) {
                Ok(c.to_string())
            } else {
                Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )))
            }
        }
        None if mains.len() == 1 => Ok(mains[0].clone()),
        None => {
            let mut msg = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                mains.join(" ")
            );
            if !inits.is_empty() {
                msg.push_str(&format!(
                    " or one of the init containers: [{}]",
                    inits.join(" ")
                ));
            }
            Err(ApiError::bad_request(msg))
        }
    }
}

/// The waiting reason of a container that has not started yet.
fn waiting_reason(pod: &Value, container: &str) -> Option<String> {
    for group in ["status.initContainerStatuses", "status.containerStatuses"] {
        for cs in meta::path(pod, group)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if cs.get("name").and_then(Value::as_str) == Some(container) {
                return cs
                    .pointer("/state/waiting/reason")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
        }
    }
    None
}

fn start(ctx: Arc<ApiContext>, target: &ResourcePath, query: &Query) -> Result<Response, ApiError> {
    let name = target.name.as_deref().unwrap_or("");
    let pod = ctx.registry.get(target.res, target.ns(), name)?;
    let container = pick_container(&pod.value, query.get("container"))?;
    let previous = query.flag("previous");
    let streams = ctx
        .kubelet
        .container_streams(pod.uid(), &container, previous);
    let Some(streams) = streams else {
        if previous {
            return Err(ApiError::bad_request(format!(
                "previous terminated container {container:?} in pod {name:?} not found"
            )));
        }
        let reason =
            waiting_reason(&pod.value, &container).unwrap_or_else(|| "ContainerCreating".into());
        let shown = match reason.as_str() {
            "ErrImagePull" | "ImagePullBackOff" => "trying and failing to pull image".to_string(),
            "InvalidImageName" | "ErrImageNeverPull" => "image can't be pulled".to_string(),
            other => other.to_string(),
        };
        return Err(ApiError::bad_request(format!(
            "container {container:?} in pod {name:?} is waiting to start: {shown}"
        )));
    };
    let follow = query.flag("follow") && !previous;
    let timestamps = query.flag("timestamps");
    let tail = query.int("tailLines")?;
    let limit = query
        .int("limitBytes")?
        .filter(|l| *l > 0)
        .map(|l| l as usize);
    let since = query.int("sinceSeconds")?;
    let since_nanos = since.map(|s| {
        time::OffsetDateTime::now_utc().unix_timestamp_nanos() - i128::from(s) * 1_000_000_000
    });
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut stream_epoch = ctx.faults.stream_epoch();
    let shutdown = ctx.shutdown.clone();
    tokio::spawn(async move {
        let mut sent = 0usize;
        let render = |chunks: Vec<LogChunk>| -> Vec<Bytes> {
            chunks
                .into_iter()
                .filter(|c| since_nanos.is_none_or(|n| c.unix_nanos >= n))
                .map(|c| {
                    if timestamps {
                        let mut b = BytesMut::from(format!("{} ", c.timestamp).as_bytes());
                        b.extend_from_slice(&c.data);
                        b.freeze()
                    } else {
                        c.data
                    }
                })
                .collect()
        };
        let (chunks, mut next, mut closed) = streams.read_from(0);
        let mut first = render(chunks);
        if let Some(n) = tail {
            first = tail_lines(first, n.max(0) as usize);
        }
        for b in first {
            if !send_limited(&tx, b, &mut sent, limit).await {
                return;
            }
        }
        if !follow {
            return;
        }
        let mut seq = streams.subscribe_log();
        while !closed {
            tokio::select! {
                changed = seq.changed() => if changed.is_err() { return },
                _ = stream_epoch.changed() => return,
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
            }
            let (chunks, n, c) = streams.read_from(next);
            next = n;
            closed = c;
            for b in render(chunks) {
                if !send_limited(&tx, b, &mut sent, limit).await {
                    return;
                }
            }
        }
        let _ = &streams as &Arc<ContainerStreams>;
    });
    let mut resp = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(resp)
}

async fn send_limited(
    tx: &mpsc::Sender<Bytes>,
    mut b: Bytes,
    sent: &mut usize,
    limit: Option<usize>,
) -> bool {
    if let Some(l) = limit {
        if *sent >= l {
            return false;
        }
        if *sent + b.len() > l {
            b.truncate(l - *sent);
        }
    }
    *sent += b.len();
    tx.send(b).await.is_ok()
}

/// The last `n` lines of the output.
fn tail_lines(chunks: Vec<Bytes>, n: usize) -> Vec<Bytes> {
    let all: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    if n == 0 {
        return Vec::new();
    }
    let mut newlines = 0;
    let mut start = 0;
    let end = if all.ends_with(b"\n") {
        all.len() - 1
    } else {
        all.len()
    };
    for i in (0..end).rev() {
        if all[i] == b'\n' {
            newlines += 1;
            if newlines == n {
                start = i + 1;
                break;
            }
        }
    }
    vec![Bytes::from(all[start..].to_vec())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn several_containers_need_a_name() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "i"}]}});
        assert_eq!(
            pick_container(&pod, None).unwrap_err().message,
            "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"
        );
        assert_eq!(
            pick_container(&pod, Some("x")).unwrap_err().message,
            "container x is not valid for pod p"
        );
        assert_eq!(pick_container(&pod, Some("i")).ok(), Some("i".into()));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let out = tail_lines(
            vec![Bytes::from_static(b"a\nb\n"), Bytes::from_static(b"c\n")],
            2,
        );
        assert_eq!(out, vec![Bytes::from_static(b"b\nc\n")]);
    }
}
