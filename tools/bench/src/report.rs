//! Figures, targets, and how they are printed: a table for people, one JSON
//! line for machines, and a section of `docs/benchmarks.md`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

/// Latency samples in microseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples(Vec<u64>);

impl Samples {
    pub fn push(&mut self, us: u64) {
        self.0.push(us);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn sorted(&self) -> Vec<u64> {
        let mut v = self.0.clone();
        v.sort_unstable();
        v
    }

    /// The nearest-rank percentile (`p` in 0..=100), in microseconds.
    pub fn percentile(&self, p: f64) -> u64 {
        let v = self.sorted();
        if v.is_empty() {
            return 0;
        }
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    pub fn max(&self) -> u64 {
        self.0.iter().copied().max().unwrap_or(0)
    }

    pub fn min(&self) -> u64 {
        self.0.iter().copied().min().unwrap_or(0)
    }

    /// For a handful of samples, where a p99 would only be the maximum:
    /// min, median (nearest rank) and max.
    pub fn spread_json(&self) -> Value {
        json!({
            "n": self.len(),
            "min_ms": ms(self.min()),
            "median_ms": ms(self.percentile(50.0)),
            "max_ms": ms(self.max()),
        })
    }

    /// `min / median / max` in milliseconds, or `-` without samples.
    pub fn spread(&self) -> String {
        if self.len() == 0 {
            return "-".into();
        }
        format!(
            "{:.1} / {:.1} / {:.1} ms",
            ms(self.min()),
            ms(self.percentile(50.0)),
            ms(self.max())
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "n": self.len(),
            "p50_ms": ms(self.percentile(50.0)),
            "p90_ms": ms(self.percentile(90.0)),
            "p99_ms": ms(self.percentile(99.0)),
            "max_ms": ms(self.max()),
        })
    }

    /// `p50 / p90 / p99 / max` in milliseconds.
    pub fn summary(&self) -> String {
        format!(
            "{:.2} / {:.2} / {:.2} / {:.2} ms",
            ms(self.percentile(50.0)),
            ms(self.percentile(90.0)),
            ms(self.percentile(99.0)),
            ms(self.max())
        )
    }
}

pub fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A target from the issue and whether this run met it.
#[derive(Debug, Clone)]
pub struct Target {
    pub figure: String,
    pub target: String,
    pub measured: String,
    pub met: bool,
}

/// What one scenario run produced.
#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: &'static str,
    /// Which section of the docs this run writes (`scenario` or
    /// `scenario:label`).
    pub section: String,
    pub command: String,
    pub params: Value,
    pub rows: Vec<(String, String)>,
    pub results: Value,
    pub targets: Vec<Target>,
}

impl Report {
    pub fn new(scenario: &'static str, command: String, params: Value) -> Report {
        Report {
            scenario,
            section: scenario.to_string(),
            command,
            params,
            rows: Vec::new(),
            results: json!({}),
            targets: Vec::new(),
        }
    }

    pub fn row(&mut self, figure: impl Into<String>, value: impl Into<String>) {
        self.rows.push((figure.into(), value.into()));
    }

    pub fn result(&mut self, key: &str, value: Value) {
        if let Some(map) = self.results.as_object_mut() {
            map.insert(key.to_string(), value);
        }
    }

    pub fn target(&mut self, figure: &str, target: &str, measured: String, met: bool) {
        self.targets.push(Target {
            figure: figure.into(),
            target: target.into(),
            measured,
            met,
        });
    }

    pub fn json_line(&self) -> String {
        json!({
            "scenario": self.scenario,
            "params": self.params,
            "results": self.results,
            "targets": self.targets.iter().map(|t| json!({
                "figure": t.figure, "target": t.target, "measured": t.measured, "met": t.met,
            })).collect::<Vec<_>>(),
        })
        .to_string()
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "== {} ({})", self.scenario, self.params);
        let width = self
            .rows
            .iter()
            .map(|(f, _)| f.len())
            .chain(self.targets.iter().map(|t| t.figure.len()))
            .max()
            .unwrap_or(0);
        for (figure, value) in &self.rows {
            let _ = writeln!(out, "  {figure:<width$}  {value}");
        }
        for t in &self.targets {
            let verdict = if t.met { "met" } else { "MISSED" };
            let _ = writeln!(
                out,
                "  target {:<width$}  {} (target {}) {verdict}",
                t.figure, t.measured, t.target
            );
        }
        out
    }

    /// The markdown section this run writes into `docs/benchmarks.md`.
    pub fn markdown(&self, machine: &str, date: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Command: `{}`  ", self.command);
        let _ = writeln!(out, "Run: {date} on {machine}\n");
        let _ = writeln!(out, "| figure | measured |\n| --- | --- |");
        for (figure, value) in &self.rows {
            let _ = writeln!(out, "| {figure} | {value} |");
        }
        if !self.targets.is_empty() {
            let _ = writeln!(
                out,
                "\n| target | goal | measured | |\n| --- | --- | --- | --- |"
            );
            for t in &self.targets {
                let verdict = if t.met { "met" } else { "**missed**" };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {verdict} |",
                    t.figure, t.target, t.measured
                );
            }
        }
        let _ = writeln!(
            out,
            "\n<details><summary>JSON</summary>\n\n```json\n{}\n```\n</details>",
            self.json_line()
        );
        out
    }
}

/// The machine the figures come from, in one line.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{cores} cores ({model}), {mem_gib:.0} GiB, Linux {kernel}, {rustc}, release build")
}

/// Replaces this scenario's section of the benchmarks document (between its
/// `<!-- bench:<name> -->` and `<!-- /bench:<name> -->` markers), appending
/// the section when the markers are missing. The prose around is kept.
pub fn write_docs(path: &Path, report: &Report, machine: &str, date: &str) -> anyhow::Result<()> {
    let mut doc = std::fs::read_to_string(path).unwrap_or_default();
    let begin = format!("<!-- bench:{} -->", report.section);
    let end = format!("<!-- /bench:{} -->", report.section);
    let body = format!("{begin}\n{}{end}", report.markdown(machine, date));
    match (doc.find(&begin), doc.find(&end)) {
        (Some(b), Some(e)) if e > b => doc.replace_range(b..e + end.len(), &body),
        _ => {
            if !doc.ends_with('\n') && !doc.is_empty() {
                doc.push('\n');
            }
            let _ = write!(doc, "\n## {}\n\n{body}\n", report.section);
        }
    }
    std::fs::write(path, doc).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut s = Samples::default();
        for v in 1..=100 {
            s.push(v);
        }
        assert_eq!(s.percentile(50.0), 50);
        assert_eq!(s.percentile(99.0), 99);
        assert_eq!(s.percentile(100.0), 100);
        assert_eq!(s.max(), 100);
        assert_eq!(Samples::default().percentile(99.0), 0);
    }

    #[test]
    fn the_spread_is_min_median_max() {
        let mut s = Samples::default();
        for v in [3_000, 1_000, 2_000, 10_000] {
            s.push(v);
        }
        assert_eq!(s.spread(), "1.0 / 2.0 / 10.0 ms");
        assert_eq!(s.spread_json()["median_ms"], 2.0);
        assert_eq!(Samples::default().spread(), "-");
    }

    #[test]
    fn a_section_is_replaced_in_place_and_the_prose_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.md");
        std::fs::write(&path, "# Benchmarks\n\nprose\n").unwrap();
        let mut report = Report::new("fanout", "cmd".into(), json!({}));
        report.row("a", "1");
        write_docs(&path, &report, "m", "d").unwrap();
        report.rows[0].1 = "2".into();
        write_docs(&path, &report, "m", "d").unwrap();
        let doc = std::fs::read_to_string(&path).unwrap();
        assert!(doc.starts_with("# Benchmarks\n\nprose\n"));
        assert_eq!(doc.matches("<!-- bench:fanout -->").count(), 1);
        assert!(doc.contains("| a | 2 |") && !doc.contains("| a | 1 |"));
    }
}
