//! One environment variable the runner reads, declared once: its name, its
//! default and its description. The loaders read a variable only through its
//! [`Setting`], the default they fall back to is the documented text parsed
//! by the same parser as the variable, and `--help` and the README table are
//! printed from the same consts, so none of them can drift from the others.

use std::cell::RefCell;
use std::collections::BTreeSet;

use runner_api::js::js_trim;

use crate::env::{
    ConfigError, Env, parse_bool, parse_non_negative_int, parse_positive_int, parse_positive_usize,
};

/// One documented environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    /// The value an unset variable means, or, in parentheses, what unset
    /// means when no value stands for it (`(unset: no auth)`).
    pub default: &'static str,
    pub description: &'static str,
}

thread_local! {
    static READS: RefCell<Option<BTreeSet<&'static str>>> = const { RefCell::new(None) };
}

impl Setting {
    /// The default as a value, or `None` when there is none (a required
    /// variable's empty default) or it only describes what unset means.
    pub fn default_value(&self) -> Option<&'static str> {
        (!self.default.is_empty() && !self.default.starts_with('(')).then_some(self.default)
    }

    /// The variable as set, untrimmed; the one place a loader reads it.
    pub fn raw<'e>(&self, env: &'e Env) -> Option<&'e str> {
        READS.with(|reads| {
            if let Some(reads) = reads.borrow_mut().as_mut() {
                reads.insert(self.name);
            }
        });
        env.get(self.name).map(String::as_str)
    }

    /// The variable, or the default when it is unset or blank. The typed
    /// readers below are for settings with a value default: without one,
    /// unset reads as zero (or `false`), so such settings are read with
    /// [`Setting::raw`] or [`Setting::string`] instead.
    fn raw_or_default<'e>(&self, env: &'e Env) -> Option<&'e str> {
        self.raw(env)
            .filter(|raw| !js_trim(raw).is_empty())
            .or(self.default_value())
    }

    /// The trimmed value, or `None` when unset or blank.
    pub fn string(&self, env: &Env) -> Option<String> {
        self.raw(env)
            .map(js_trim)
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
    }

    /// The trimmed value, or the default when unset or blank.
    pub fn string_or_default(&self, env: &Env) -> String {
        self.string(env)
            .unwrap_or_else(|| self.default_value().unwrap_or_default().to_owned())
    }

    /// A whole number above zero (`parsePositiveInt`).
    pub fn positive_int(&self, env: &Env) -> Result<u64, ConfigError> {
        parse_positive_int(self.raw_or_default(env), 0, self.name)
    }

    /// A whole number above zero that fits a `usize`.
    pub fn positive_usize(&self, env: &Env) -> Result<usize, ConfigError> {
        parse_positive_usize(self.raw_or_default(env), 0, self.name)
    }

    /// A whole number of zero or more.
    pub fn non_negative_int(&self, env: &Env) -> Result<u64, ConfigError> {
        parse_non_negative_int(self.raw_or_default(env), 0, self.name)
    }

    /// A boolean (`parseBool`).
    pub fn bool(&self, env: &Env) -> Result<bool, ConfigError> {
        parse_bool(self.raw_or_default(env), false, self.name)
    }
}

/// Runs `load` and returns, beside its result, the names of the settings it
/// read on this thread.
pub fn names_read<T>(load: impl FnOnce() -> T) -> (T, BTreeSet<&'static str>) {
    let outer = READS.with(|reads| reads.borrow_mut().replace(BTreeSet::new()));
    let value = load();
    let read = READS.with(|reads| std::mem::replace(&mut *reads.borrow_mut(), outer));
    (value, read.unwrap_or_default())
}

/// The names of `settings`, for comparing with [`names_read`].
pub fn names_of(settings: &[&[Setting]]) -> BTreeSet<&'static str> {
    settings
        .iter()
        .flat_map(|table| table.iter().map(|setting| setting.name))
        .collect()
}

/// The environment that sets every setting of `settings` that has a value
/// default to that default, for checking that the documented defaults are
/// the ones the loader falls back to.
pub fn env_of_defaults(settings: &[&[Setting]]) -> Env {
    settings
        .iter()
        .flat_map(|table| table.iter())
        .filter_map(|setting| {
            setting
                .default_value()
                .map(|value| (setting.name.to_owned(), value.to_owned()))
        })
        .collect()
}

/// Checks, for a crate's tests, that `load` falls back to exactly what the
/// tables document: setting every variable that has a value default to that
/// default loads what an empty environment loads.
///
/// # Panics
///
/// When the two loads differ.
pub fn assert_documented_defaults_are_the_defaults<T, E>(
    tables: &[&[Setting]],
    load: impl Fn(&Env) -> Result<T, E>,
) where
    T: PartialEq + std::fmt::Debug,
    E: std::fmt::Debug,
{
    let unset = load(&Env::new());
    let documented = load(&env_of_defaults(tables));
    assert_eq!(
        documented.as_ref().map_err(|err| format!("{err:?}")),
        unset.as_ref().map_err(|err| format!("{err:?}")),
        "a documented default differs from what unset means"
    );
}

/// Checks, for a crate's tests, that `load` reads exactly the variables of
/// `tables` except those named in `read_elsewhere` (documented there, read by
/// another loader), counting the reads over every environment of `envs`
/// (some variables are read only when another is set).
///
/// # Panics
///
/// When a variable is read but undocumented, or documented but not read.
pub fn assert_reads_exactly<T>(
    tables: &[&[Setting]],
    read_elsewhere: &[&str],
    envs: &[Env],
    load: impl Fn(&Env) -> T,
) {
    let mut read = BTreeSet::new();
    for env in envs {
        read.extend(names_read(|| load(env)).1);
    }
    let mut expected = names_of(tables);
    for name in read_elsewhere {
        assert!(expected.remove(name), "{name} is not in the tables");
    }
    assert_eq!(read, expected, "the loader's reads differ from its tables");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::env_from_pairs;

    const COUNT: Setting = Setting {
        name: "COUNT",
        default: "3",
        description: "",
    };
    const NONE: Setting = Setting {
        name: "NONE",
        default: "(unset)",
        description: "",
    };

    #[test]
    fn a_blank_or_unset_variable_means_the_documented_default() {
        assert_eq!(COUNT.positive_int(&Env::new()), Ok(3));
        assert_eq!(
            COUNT.positive_int(&env_from_pairs(&[("COUNT", " ")])),
            Ok(3)
        );
        assert_eq!(
            COUNT.positive_int(&env_from_pairs(&[("COUNT", "7")])),
            Ok(7)
        );
        assert_eq!(
            COUNT
                .positive_int(&env_from_pairs(&[("COUNT", "0")]))
                .map_err(|err| err.to_string()),
            Err("COUNT must be a positive integer, got '0'.".to_owned())
        );
        assert_eq!(NONE.default_value(), None);
        assert_eq!(NONE.string_or_default(&Env::new()), "");
    }

    #[test]
    fn reads_are_recorded_only_inside_names_read() {
        let env = Env::new();
        COUNT.raw(&env);
        let ((), read) = names_read(|| {
            COUNT.raw(&env);
            let ((), inner) = names_read(|| {
                NONE.raw(&env);
            });
            assert_eq!(inner, BTreeSet::from(["NONE"]));
        });
        assert_eq!(read, BTreeSet::from(["COUNT"]));
    }
}
