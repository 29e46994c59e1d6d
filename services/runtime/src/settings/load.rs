//! Loading a configuration: the files, the environment overrides, the flags, and what the
//! pools file says (routes, bound topics, the rules it yields).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ksched_core::events::Reconfigure;
use ksched_core::hash::sha256_parts;
use ksched_core::rules::{PoolRules, Rules, TenantRules};
use ksched_policy::PolicyBundle;
use serde::{Deserialize, Serialize};
use serde_norway::Value as Yaml;

use crate::error::{Error, Result};

use super::{ENV_PREFIX, Settings};

/// `pools.yaml`: SPEC §3.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolsFile {
    /// Job topic -> one pool, a list of pools (in preference order), or
    /// `{pools: ..., tenants: [...]}` binding the topic to the tenants it may carry.
    pub topics: BTreeMap<String, TopicRoute>,
    pub pools: BTreeMap<String, PoolRules>,
    pub tenants: BTreeMap<String, TenantRules>,
}

impl PoolsFile {
    /// Puts this file's routing, pools and tenants into `rules` (the rest of the rules
    /// come from `ksched.yaml`).
    pub fn apply_to(&self, rules: &mut Rules) {
        rules.topics = self
            .topics
            .iter()
            .map(|(t, p)| (t.clone(), p.pools()))
            .collect();
        rules.topic_tenants = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.tenants()?.to_vec())))
            .collect();
        rules.topic_principals = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.principal()?.to_owned())))
            .collect();
        rules.topic_concurrency = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.concurrency()?.clone())))
            .collect();
        rules.topic_unique = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.bound()?.unique.clone()?)))
            .collect();
        rules.topic_debounce = self
            .topics
            .iter()
            .filter_map(|(t, p)| Some((t.clone(), p.bound()?.debounce.clone()?)))
            .collect();
        rules.pools = self.pools.clone();
        rules.tenants = self.tenants.clone();
    }
}

/// `default` or `[gpu-a100, gpu-h100]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A job topic's entry in `pools.yaml`: its pools, and the tenants it may carry if bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a pool, a list of pools, or {pools: [...], tenants: [...], principal: ..., concurrency: {key: ..., limit: N, rate: N/PERIOD, burst: N}, unique: {key: ..., for: SPAN}, debounce: {key: ..., wait: SPAN, max_wait: SPAN}} (no other keys)"
)]
// Read once per topic from pools.yaml: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum TopicRoute {
    Pools(OneOrMany),
    Bound(BoundTopic),
}

/// `{pools: [batch, default], tenants: [acme], principal: acme-producer, concurrency:
/// {key: "label:customer", limit: 1}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundTopic {
    pub pools: OneOrMany,
    /// Tenants whose jobs the topic carries; their job ids start with `<tenant_id>:`.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The principal that produces the topic (the only one its ACL lets write): its jobs are
    /// that principal's (`principal_id` filled in; another is refused), so four eyes knows
    /// who submitted them. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// At most `limit` of its jobs of one concurrency key at once, and at most `rate` of them
    /// placed per period (SPEC §10). Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ksched_core::rules::ConcurrencyRule>,
    /// One job per key within a span (SPEC §10): `{key: "label:report", for: 1h}`.
    /// Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<ksched_core::rules::UniqueRule>,
    /// Jobs of one key close together collapse into the last (SPEC §10): `{key:
    /// "label:document", wait: 5s, max_wait: 1m}`. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<ksched_core::rules::DebounceRule>,
}

impl TopicRoute {
    pub fn pools(&self) -> Vec<String> {
        match self {
            TopicRoute::Pools(p) | TopicRoute::Bound(BoundTopic { pools: p, .. }) => p.to_vec(),
        }
    }

    pub fn tenants(&self) -> Option<&[String]> {
        match self {
            TopicRoute::Pools(_) => None,
            TopicRoute::Bound(b) if b.tenants.is_empty() => None,
            TopicRoute::Bound(b) => Some(&b.tenants),
        }
    }

    pub fn principal(&self) -> Option<&str> {
        match self {
            TopicRoute::Pools(_) => None,
            TopicRoute::Bound(b) => b.principal.as_deref(),
        }
    }

    fn bound(&self) -> Option<&BoundTopic> {
        match self {
            TopicRoute::Pools(_) => None,
            TopicRoute::Bound(b) => Some(b),
        }
    }

    pub fn concurrency(&self) -> Option<&ksched_core::rules::ConcurrencyRule> {
        match self {
            TopicRoute::Pools(_) => None,
            TopicRoute::Bound(b) => b.concurrency.as_ref(),
        }
    }
}

/// Everything `ksched run` needs, loaded and checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub settings: Settings,
    pub rules: Rules,
    pub policy: PolicyBundle,
    /// Where settings came from, for messages.
    pub source: Option<PathBuf>,
    /// How the processor frames what it writes: single-object unless the schema registry's
    /// ids were set at start (`schema_registry.output_format: confluent`).
    pub framing: std::sync::Arc<ksched_codec::Framing>,
}

/// Flags that override the file and the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub bootstrap_servers: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub http_listen: Option<String>,
    pub pools_file: Option<PathBuf>,
    pub policy_dir: Option<PathBuf>,
    /// librdkafka properties from `--command-config` then `-X key=value`, applied over
    /// `kafka.properties` in that order.
    pub kafka_properties: Vec<(String, String)>,
}

/// Loads the settings alone: `path` (or defaults), then `KSCHED__*` variables from `env`,
/// then `flags`; relative paths resolved, validated. What every tool that talks to Kafka
/// shares with `ksched run`.
pub fn load_settings(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &Overrides,
) -> Result<Settings> {
    let (mut tree, base_dir) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| Error::Config {
                source_name: p.display().to_string(),
                detail: format!("cannot read it: {e}"),
            })?;
            let tree: Yaml = if text.trim().is_empty() {
                Yaml::Mapping(Default::default())
            } else {
                serde_norway::from_str(&text).map_err(|e| Error::Config {
                    source_name: p.display().to_string(),
                    detail: e.to_string(),
                })?
            };
            let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
            (tree, dir)
        }
        None => (Yaml::Mapping(Default::default()), PathBuf::from(".")),
    };
    apply_env(&mut tree, env)?;
    let source_name = path.map_or_else(|| "defaults".to_owned(), |p| p.display().to_string());
    let mut settings: Settings = serde_norway::from_value(tree).map_err(|e| Error::Config {
        source_name: source_name.clone(),
        detail: e.to_string(),
    })?;
    if let Some(v) = &flags.bootstrap_servers {
        settings.kafka.bootstrap_servers = v.clone();
    }
    if let Some(v) = &flags.data_dir {
        settings.storage.data_dir = v.clone();
    }
    if let Some(v) = &flags.http_listen {
        settings.http.listen = v.clone();
    }
    if let Some(v) = &flags.pools_file {
        settings.pools_file = v.clone();
    }
    if let Some(v) = &flags.policy_dir {
        settings.policy_dir = v.clone();
    }
    for (k, v) in &flags.kafka_properties {
        settings.kafka.properties.insert(k.clone(), v.clone());
    }
    // Relative paths in the file are relative to the file; flags are relative to the cwd.
    let resolve = |p: &Path, from_flag: bool| {
        if p.is_absolute() || from_flag {
            p.to_path_buf()
        } else {
            base_dir.join(p)
        }
    };
    settings.pools_file = resolve(&settings.pools_file, flags.pools_file.is_some());
    settings.policy_dir = resolve(&settings.policy_dir, flags.policy_dir.is_some());
    if let Some(t) = &settings.http.tokens_file {
        settings.http.tokens_file = Some(resolve(t, false));
    }
    if let Some(j) = &mut settings.http.jwt {
        j.jwks_file = resolve(&j.jwks_file, false);
    }
    if let Some(f) = &settings.schema_registry.basic_auth_file {
        settings.schema_registry.basic_auth_file = Some(resolve(f, false));
    }
    if let Some(t) = &mut settings.http.tls {
        t.cert_file = resolve(&t.cert_file, false);
        t.key_file = resolve(&t.key_file, false);
        t.client_ca_file = t.client_ca_file.as_deref().map(|c| resolve(c, false));
    }
    settings.validate()?;
    Ok(settings)
}

impl Config {
    /// Loads the settings ([`load_settings`]), then the pools file and the policy bundle, and
    /// validates everything.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Config> {
        let settings = load_settings(path, env, flags)?;
        let pools = load_pools(&settings.pools_file)?;
        let mut rules = Rules {
            timing: settings.scheduler.timing.clone(),
            retry: settings.scheduler.retry.clone(),
            overload: settings.scheduler.overload.clone(),
            breaker: settings.scheduler.breaker.clone(),
            limits: settings.scheduler.limits.clone(),
            // Filled in from the broker's metadata at start (topics::dispatch_partitions).
            dispatch_partitions: BTreeMap::new(),
            four_eyes: settings.http.four_eyes,
            ..Rules::default()
        };
        pools.apply_to(&mut rules);
        let shards = u32::try_from(settings.topics.journal_partitions).unwrap_or(1);
        rules
            .validate()
            .and_then(|()| ksched_core::rules::check_shards(&rules, shards))
            .map_err(|e| Error::Config {
                source_name: settings.pools_file.display().to_string(),
                detail: e.to_string(),
            })?;
        let policy = if settings.policy_dir.is_dir() {
            PolicyBundle::from_dir(&settings.policy_dir).map_err(|e| Error::Config {
                source_name: settings.policy_dir.display().to_string(),
                detail: e.to_string(),
            })?
        } else {
            return Err(Error::Config {
                source_name: settings.policy_dir.display().to_string(),
                detail: "policy directory not found (set policy_dir, or --policy-dir)".into(),
            });
        };
        Ok(Config {
            settings,
            rules,
            policy,
            source: path.map(Path::to_path_buf),
            framing: Default::default(),
        })
    }

    /// The input that puts these rules and this policy in force (journaled).
    pub fn reconfigure(&self) -> Reconfigure {
        let rules_json = self.rules.to_canonical_json();
        Reconfigure {
            rules_id: sha256_parts([rules_json.as_bytes()])[..16].to_owned(),
            rules_json,
            policy_modules: self.policy.modules.clone(),
            policy_data_json: self.policy.data_json.clone(),
            policy_snapshot: self.policy.snapshot_id(),
        }
    }

    /// The effective configuration as YAML, for `--print-config`.
    pub fn to_yaml(&self) -> String {
        #[derive(Serialize)]
        struct Printed<'a> {
            #[serde(flatten)]
            settings: &'a Settings,
            effective_rules: &'a Rules,
            policy_snapshot: String,
            policy_modules: Vec<&'a String>,
        }
        let mut settings = self.settings.clone();
        settings.kafka.properties = settings.kafka.masked_properties();
        let printed = Printed {
            settings: &settings,
            effective_rules: &self.rules,
            policy_snapshot: self.policy.snapshot_id(),
            policy_modules: self.policy.modules.keys().collect(),
        };
        serde_norway::to_string(&printed).unwrap_or_else(|e| format!("# cannot print: {e}\n"))
    }
}

/// Parses a settings file's text alone (no environment, no flags, no pools or policy): what
/// the operator tools need to find Kafka and the API.
pub fn parse_settings(text: &str) -> Result<Settings> {
    if text.trim().is_empty() {
        return Ok(Settings::default());
    }
    serde_norway::from_str(text).map_err(|e| Error::Config {
        source_name: "settings".into(),
        detail: e.to_string(),
    })
}

/// Parses a pools file's text.
pub fn parse_pools(text: &str) -> Result<PoolsFile> {
    serde_norway::from_str(text).map_err(|e| Error::Config {
        source_name: "pools".into(),
        detail: e.to_string(),
    })
}

fn load_pools(path: &Path) -> Result<PoolsFile> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        source_name: path.display().to_string(),
        detail: format!("cannot read the pools file: {e}"),
    })?;
    serde_norway::from_str(&text).map_err(|e| Error::Config {
        source_name: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// Applies `KSCHED__A__B=value` to the YAML tree (`a.b = value`).
fn apply_env(tree: &mut Yaml, env: impl IntoIterator<Item = (String, String)>) -> Result<()> {
    for (name, value) in env {
        let Some(path) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let keys: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
        if keys.iter().any(String::is_empty) {
            return Err(Error::Config {
                source_name: name.clone(),
                detail: "empty path segment; use KSCHED__SECTION__FIELD".into(),
            });
        }
        let parsed: Yaml = serde_norway::from_str(&value).unwrap_or(Yaml::String(value.clone()));
        let mut node = &mut *tree;
        for (i, key) in keys.iter().enumerate() {
            let Yaml::Mapping(map) = node else {
                return Err(Error::Config {
                    source_name: name.clone(),
                    detail: format!("{} is not a section", keys[..i].join(".")),
                });
            };
            let k = Yaml::String(key.clone());
            if i == keys.len() - 1 {
                map.insert(k, parsed.clone());
                break;
            }
            node = map
                .entry(k)
                .or_insert_with(|| Yaml::Mapping(Default::default()));
        }
    }
    Ok(())
}
