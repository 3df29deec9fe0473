//! The built-in stand-in for busybox running the session's init script
//! (`wget -qO /tmp/body.tgz "<url>"; tar xzf /tmp/body.tgz -C /app`): it
//! really downloads the URL and unpacks the gzip'd tar into the directory
//! the pod's `/app` volume is, failing the way busybox would.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::paths::Mounts;

/// What the init script asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchPlan {
    pub url: String,
    /// Container path the archive is written to (`/tmp/body.tgz`).
    pub archive: String,
    /// Container path it is unpacked into (`/app`).
    pub dest: String,
}

/// Recognizes the bundle-fetch script; `None` for any other script.
pub fn plan(script: &str) -> Option<FetchPlan> {
    let tokens = shell_words(script);
    let wget = tokens.iter().position(|t| t == "wget")?;
    let mut archive = None;
    let mut url = None;
    let mut i = wget + 1;
    while i < tokens.len() && tokens[i] != ";" {
        let t = &tokens[i];
        if t == "-O" || t == "-qO" {
            archive = tokens.get(i + 1).cloned();
            i += 2;
            continue;
        }
        if let Some(rest) = t.strip_prefix("-qO").or_else(|| t.strip_prefix("-O")) {
            archive = Some(rest.to_string());
        } else if !t.starts_with('-') {
            url = Some(t.clone());
        }
        i += 1;
    }
    let tar = tokens.iter().position(|t| t == "tar")?;
    let dest = tokens[tar..]
        .iter()
        .position(|t| t == "-C")
        .and_then(|p| tokens.get(tar + p + 1))
        .cloned()?;
    Some(FetchPlan {
        url: url?,
        archive: archive.unwrap_or_else(|| "/tmp/body.tgz".into()),
        dest,
    })
}

/// A small shell tokenizer: quotes, and `;` as its own token.
fn shell_words(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut quote: Option<char> = None;
    for c in script.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                has = true;
            }
            (None, ' ' | '\t' | '\n') => {
                if has || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            (None, ';') => {
                if has || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
                out.push(";".into());
            }
            (None, c) => cur.push(c),
        }
    }
    if has || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Output and exit code of a fetch, as busybox would report them.
pub struct FetchOutcome {
    pub stderr: Vec<String>,
    pub exit_code: i32,
}

/// Runs the plan: download, write the archive, unpack.
pub async fn run(plan: &FetchPlan, mounts: &Mounts, http: &reqwest::Client) -> FetchOutcome {
    let fail = |msg: String| FetchOutcome {
        stderr: vec![msg],
        exit_code: 1,
    };
    let Some(archive) = mounts.map_path(&plan.archive) else {
        return fail(format!(
            "wget: can't open '{}': No such file or directory",
            plan.archive
        ));
    };
    let Some(dest) = mounts.map_path(&plan.dest) else {
        return fail(format!(
            "tar: can't change directory to '{}': No such file or directory",
            plan.dest
        ));
    };
    let body = match download(&plan.url, http).await {
        Ok(b) => b,
        Err(msg) => return fail(msg),
    };
    if let Err(e) = tokio::fs::write(&archive, &body).await {
        return fail(format!("wget: can't open '{}': {e}", plan.archive));
    }
    let unpack = tokio::task::spawn_blocking(move || unpack(&archive, &dest)).await;
    match unpack {
        Ok(Ok(())) => FetchOutcome {
            stderr: Vec::new(),
            exit_code: 0,
        },
        Ok(Err(msg)) => fail(msg),
        Err(e) => fail(format!("tar: {e}")),
    }
}

async fn download(url: &str, http: &reqwest::Client) -> Result<Bytes, String> {
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("wget: can't connect to remote host: {}", root_cause(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!(
            "wget: server returned error: HTTP/1.1 {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ));
    }
    resp.bytes()
        .await
        .map_err(|e| format!("wget: error getting response: {e}"))
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Unpacks a `.tar.gz` into `dest`, refusing entries that escape it.
fn unpack(archive: &Path, dest: &PathBuf) -> Result<(), String> {
    let file = std::fs::File::open(archive).map_err(|e| format!("tar: can't open: {e}"))?;
    let gz = flate2::read::GzDecoder::new(file);
    let mut tar = tar::Archive::new(gz);
    let entries = tar
        .entries()
        .map_err(|_| "tar: invalid tar magic".to_string())?;
    for entry in entries {
        let mut entry = entry.map_err(|_| "tar: short read".to_string())?;
        let unpacked = entry.unpack_in(dest).map_err(|e| format!("tar: {e}"))?;
        if !unpacked {
            let path = entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(format!("tar: {path}: path escapes the destination"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_init_script_is_recognized() {
        let script = r#"set -e; wget -qO /tmp/body.tgz "http://127.0.0.1:8062/internal/bundles/abc?token=ff"; tar xzf /tmp/body.tgz -C /app"#;
        assert_eq!(
            plan(script),
            Some(FetchPlan {
                url: "http://127.0.0.1:8062/internal/bundles/abc?token=ff".into(),
                archive: "/tmp/body.tgz".into(),
                dest: "/app".into(),
            })
        );
        assert_eq!(plan("echo hi; exit 3"), None);
    }
}
