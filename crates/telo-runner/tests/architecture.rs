//! The module map stays one-way: no product crate has an import circle
//! between sibling modules (docs/architecture.md, "The crates").
//!
//! Each crate's module tree is read from its sources, starting at `lib.rs`
//! and `main.rs`. A reference from module `a::x` to `crate::a::y::…`, where
//! `x` and `y` are both modules declared in `a`, is an arrow `x → y` between
//! siblings of `a`. A module split into files uses its own parent's items
//! as one module would: that is not an arrow. Test code (`#[cfg(test)]`) is
//! left out, as are comments. A circle among the arrows of one parent fails
//! the test, naming the files that draw it.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module's path below the crate root (`[]` is the root).
type ModPath = Vec<String>;

struct Module {
    path: ModPath,
    file: PathBuf,
    /// Module names declared in it (its children).
    children: BTreeSet<String>,
    /// Absolute (crate-rooted) paths it refers to.
    refs: Vec<ModPath>,
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg") && {
            let text = attr.meta.to_token_stream_string();
            text.contains("test") && !text.contains("not")
        }
    })
}

trait MetaText {
    fn to_token_stream_string(&self) -> String;
}

impl MetaText for syn::Meta {
    fn to_token_stream_string(&self) -> String {
        quote::ToTokens::to_token_stream(self).to_string()
    }
}

/// Collects the paths a file refers to, relative to where they stand.
#[derive(Default)]
struct Refs {
    /// Paths as written, starting with `crate`, `super` or `self`.
    raw: Vec<Vec<String>>,
    /// `mod x;` declarations, with their `#[path]` if any.
    mods: Vec<(String, Option<String>)>,
}

impl Refs {
    fn push(&mut self, segments: Vec<String>) {
        if matches!(
            segments.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) {
            self.raw.push(segments);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let mut full = prefix.clone();
                if name.ident != "self" {
                    full.push(name.ident.to_string());
                }
                self.push(full);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                if rename.ident != "self" {
                    full.push(rename.ident.to_string());
                }
                self.push(full);
            }
            syn::UseTree::Glob(_) => self.push(prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside macro arguments (`crate :: a :: b` token runs).
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(group) = &trees[i] {
                self.tokens(group.stream());
                i += 1;
                continue;
            }
            let TokenTree::Ident(ident) = &trees[i] else {
                i += 1;
                continue;
            };
            let first = ident.to_string();
            if !matches!(first.as_str(), "crate" | "super" | "self") {
                i += 1;
                continue;
            }
            let mut segments = vec![first];
            let mut j = i + 1;
            loop {
                let colons = matches!(
                    (trees.get(j), trees.get(j + 1)),
                    (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                        if a.as_char() == ':' && b.as_char() == ':'
                );
                match (colons, trees.get(j + 2)) {
                    (true, Some(TokenTree::Ident(next))) => {
                        segments.push(next.to_string());
                        j += 3;
                    }
                    _ => break,
                }
            }
            if segments.len() > 1 {
                self.push(segments);
            }
            i = j.max(i + 1);
        }
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_none() {
            let path = item.attrs.iter().find_map(|attr| match &attr.meta {
                syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            });
            self.mods.push((item.ident.to_string(), path));
        }
        // An inline module's paths count as its file's.
        syn::visit::visit_item_mod(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.push(
            path.segments
                .iter()
                .map(|segment| segment.ident.to_string())
                .collect(),
        );
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// Where `mod name;` declared in `file` lives.
fn child_file(file: &Path, name: &str, path_attr: Option<&str>) -> PathBuf {
    let stem = file.file_stem().unwrap().to_str().unwrap();
    let dir = if matches!(stem, "lib" | "main" | "mod") {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    if let Some(path) = path_attr {
        return file.parent().unwrap().join(path);
    }
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

fn resolve(module: &ModPath, raw: &[String]) -> Option<ModPath> {
    let mut base: ModPath = module.clone();
    let mut rest = raw;
    match raw.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &raw[1..];
        }
        Some("self") => rest = &raw[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

fn read_crate(root: &Path) -> Vec<Module> {
    let mut modules = Vec::new();
    let mut queue: Vec<(ModPath, PathBuf)> = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| root.join("src").join(name))
        .filter(|file| file.exists())
        .map(|file| (Vec::new(), file))
        .collect();
    let mut seen = BTreeSet::new();
    while let Some((path, file)) = queue.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        let mut refs = Refs::default();
        if !is_test_only(&parsed.attrs) {
            refs.visit_file(&parsed);
        }
        let mut children = BTreeSet::new();
        for (name, path_attr) in &refs.mods {
            children.insert(name.clone());
            let mut child = path.clone();
            child.push(name.clone());
            queue.push((child, child_file(&file, name, path_attr.as_deref())));
        }
        let resolved = refs
            .raw
            .iter()
            .filter_map(|raw| resolve(&path, raw))
            .collect();
        modules.push(Module {
            path,
            file,
            children,
            refs: resolved,
        });
    }
    modules
}

/// Sibling arrows per parent: parent → (from → to → an example file).
type Arrows = BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, PathBuf>>>;

fn arrows(modules: &[Module]) -> Arrows {
    let children: BTreeMap<&ModPath, &BTreeSet<String>> =
        modules.iter().map(|m| (&m.path, &m.children)).collect();
    let mut arrows = Arrows::new();
    for module in modules {
        for target in &module.refs {
            let common = module
                .path
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= module.path.len() || common >= target.len() {
                continue;
            }
            let parent = module.path[..common].to_vec();
            let (from, to) = (&module.path[common], &target[common]);
            if from == to || !children.get(&parent).is_some_and(|c| c.contains(to)) {
                continue;
            }
            arrows
                .entry(parent)
                .or_default()
                .entry(from.clone())
                .or_default()
                .entry(to.clone())
                .or_insert_with(|| module.file.clone());
        }
    }
    arrows
}

/// The strongly connected groups of more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeMap<String, PathBuf>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, PathBuf>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, node: &'a str) {
        s.index.insert(node, s.next);
        s.low.insert(node, s.next);
        s.next += 1;
        s.stack.push(node);
        s.on_stack.insert(node);
        if let Some(edges) = s.graph.get(node) {
            for to in edges.keys() {
                let to = to.as_str();
                if !s.index.contains_key(to) {
                    visit(s, to);
                    let low = s.low[node].min(s.low[to]);
                    s.low.insert(node, low);
                } else if s.on_stack.contains(to) {
                    let low = s.low[node].min(s.index[to]);
                    s.low.insert(node, low);
                }
            }
        }
        if s.low[node] == s.index[node] {
            let mut group = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                group.push(top.to_owned());
                if top == node {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.found.push(group);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found
}

fn describe(crate_dir: &Path) -> Vec<String> {
    let modules = read_crate(crate_dir);
    let mut report = Vec::new();
    for (parent, graph) in arrows(&modules) {
        for group in circles(&graph) {
            let parent = if parent.is_empty() {
                "crate".to_owned()
            } else {
                format!("crate::{}", parent.join("::"))
            };
            let mut lines = vec![format!(
                "{}: a circle among {parent}'s modules {}",
                crate_dir.file_name().unwrap().to_str().unwrap(),
                group.join(", ")
            )];
            for from in &group {
                for (to, file) in &graph[from] {
                    if group.contains(to) {
                        lines.push(format!(
                            "    {from} → {to} (in {})",
                            file.strip_prefix(crate_dir).unwrap_or(file).display()
                        ));
                    }
                }
            }
            report.push(lines.join("\n"));
        }
    }
    report
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn no_product_crate_has_a_circle_between_sibling_modules() {
    let mut report = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(crates_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("Cargo.toml").exists())
        .collect();
    crates.sort();
    assert!(crates.len() >= 7, "found the product crates: {crates:?}");
    for dir in &crates {
        report.extend(describe(dir));
    }
    assert!(
        report.is_empty(),
        "import circles between sibling modules:\n{}",
        report.join("\n")
    );
}

/// The reader finds the circles it is meant to: a crate drawn in a
/// temporary directory with one circle through a `use`, one through a path
/// in a macro, a child using its parent's items (no arrow) and a test
/// module's import (left out).
#[test]
fn the_reader_sees_circles_through_uses_and_macros_and_not_through_parents_or_tests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\nmod d;\npub struct Root;\n",
    )
    .unwrap();
    std::fs::write(src.join("a.rs"), "mod x;\nmod y;\npub struct A;\n").unwrap();
    std::fs::write(src.join("a/x.rs"), "use super::y::Y;\nuse super::A;\n").unwrap();
    std::fs::write(
        src.join("a/y.rs"),
        "pub struct Y;\nfn f() { let _ = format!(\"{:?}\", crate::a::x::X); }\n",
    )
    .unwrap();
    std::fs::write(src.join("b.rs"), "use crate::c::C;\npub struct B;\n").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub struct C;\n#[cfg(test)]\nmod tests { use crate::b::B; }\n",
    )
    .unwrap();
    std::fs::write(src.join("d.rs"), "use crate::Root;\n").unwrap();
    let report = describe(dir.path());
    assert_eq!(report.len(), 1, "{report:#?}");
    assert!(
        report[0].contains("crate::a's modules x, y"),
        "{}",
        report[0]
    );
}
