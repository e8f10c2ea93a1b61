use serde_json::json;

use super::*;
use crate::yaml;

fn engine_with(template: &str) -> (Engine, TemplateId) {
    let mut b = EngineBuilder::new(Limits::default());
    let id = b.add_template("t", TemplateKind::Object, template).unwrap();
    (b.build().unwrap(), id)
}

fn render_yaml(template: &str, spec: serde_json::Value) -> Result<serde_json::Value, String> {
    let (engine, id) = engine_with(template);
    let ctx = minijinja::context! { spec => to_value(&spec) };
    let text = engine
        .render(&id, &ctx, "test")
        .map_err(|e| e.to_string())?;
    yaml::parse_value(&text, &yaml::Limits::FILES).map_err(|e| format!("{e}\n---\n{text}"))
}

fn eval(expr: &str, ctx: serde_json::Value) -> Result<Value, RenderError> {
    let mut b = EngineBuilder::new(Limits::default());
    let id = b.add_expression(expr).unwrap();
    let engine = b.build().unwrap();
    engine.eval(id, &to_value(&ctx), "test")
}

const HOSTILE: &[&str] = &[
    "line one\nline two",
    "quote \" and 'single' and \\ backslash",
    "{{ parent.metadata.name }}",
    "{% for x in range(10) %}x{% endfor %}",
    "---\nkind: Secret\nmetadata:\n  name: evil",
    "...\n---",
    "key: value",
    "- a\n- b",
    "# comment",
    "&anchor *alias !!binary",
    "null",
    "true",
    "0x1F",
    "\u{0}\u{7}\u{1b}[31m control chars",
    "emoji 🚀 and ünïcödé",
    "}}{{",
];

#[test]
fn hostile_strings_stay_single_string_values() {
    for hostile in HOSTILE {
        let out = render_yaml(
            "metadata:\n  name: x\ndata:\n  value: {{ spec.v }}\n  other: fixed\n",
            json!({"v": hostile}),
        )
        .unwrap_or_else(|e| panic!("{hostile:?}: {e}"));
        assert_eq!(out["data"]["value"], json!(hostile), "{hostile:?}");
        assert_eq!(out["data"]["other"], "fixed");
        assert_eq!(
            out.as_object().unwrap().len(),
            2,
            "no keys added by {hostile:?}"
        );
    }
}

#[test]
fn hostile_values_inside_concatenation_stay_data() {
    for hostile in HOSTILE {
        let out = render_yaml("name: {{ 'prefix-' ~ spec.v }}\n", json!({"v": hostile})).unwrap();
        assert_eq!(out["name"], json!(format!("prefix-{hostile}")));
    }
}

#[test]
fn very_long_strings_are_escaped_whole() {
    let long = "x\n".repeat(100_000);
    let out = render_yaml("v: {{ spec.v }}\n", json!({"v": long})).unwrap();
    assert_eq!(out["v"].as_str().unwrap().len(), long.len());
}

#[test]
fn maps_and_lists_render_as_flow_collections() {
    let spec = json!({"m": {"a": 1, "b": ["x", "y: z"]}, "n": 5, "t": true});
    let out = render_yaml(
        "m: {{ spec.m }}\nn: {{ spec.n }}\nt: {{ spec.t }}\nyes: no\n",
        spec.clone(),
    )
    .unwrap();
    assert_eq!(out["m"], spec["m"]);
    assert_eq!(out["n"], 5, "`n` is a key, not YAML 1.1 false");
    assert_eq!(out["t"], true);
    assert_eq!(out["yes"], "no", "YAML 1.2: only true/false are booleans");
}

#[test]
fn hostile_map_keys_cannot_add_structure() {
    let spec = json!({"labels": {"a\nb: c": "d", "}": "{"}});
    let out = render_yaml("labels: {{ spec.labels }}\nfixed: 1\n", spec.clone()).unwrap();
    assert_eq!(out["labels"], spec["labels"]);
    assert_eq!(out["fixed"], 1);
}

#[test]
fn safe_filter_opts_out_of_escaping() {
    let out = render_yaml("v: {{ spec.v | safe }}\n", json!({"v": "[1, 2]"})).unwrap();
    assert_eq!(out["v"], json!([1, 2]));
}

#[test]
fn printing_a_missing_value_is_an_error() {
    let err = render_yaml("v: {{ spec.missing }}\n", json!({})).unwrap_err();
    assert!(err.contains("missing value"), "{err}");
    let err = render_yaml("v: {{ spec.a.b.c }}\n", json!({})).unwrap_err();
    assert!(err.contains("missing value"), "{err}");
}

#[test]
fn missing_values_chain_into_default() {
    let out = render_yaml("v: {{ spec.a.b.c | default(7) }}\n", json!({})).unwrap();
    assert_eq!(out["v"], 7);
    let out = render_yaml("v: {{ spec.a.b is defined }}\n", json!({})).unwrap();
    assert_eq!(out["v"], false);
}

#[test]
fn expression_yielding_missing_value_is_an_error() {
    let err = eval("spec.expose", json!({"spec": {}})).unwrap_err();
    assert!(err.message.contains("missing value"), "{err}");
    assert!(err.message.contains("spec.expose"), "{err}");
    assert!(eval("spec.expose | default(false)", json!({"spec": {}})).is_ok());
}

#[test]
fn expressions_have_typed_results() {
    assert_eq!(eval("1 + 2", json!({})).unwrap(), Value::from(3));
    assert!(
        eval("spec.n > 2", json!({"spec": {"n": 3}}))
            .unwrap()
            .is_true()
    );
    let list = eval("spec.hosts", json!({"spec": {"hosts": ["a", "b"]}})).unwrap();
    assert_eq!(list.len(), Some(2));
}

#[test]
fn fuel_limit_stops_runaway_loops() {
    let mut b = EngineBuilder::new(Limits {
        fuel: 1_000,
        ..Limits::default()
    });
    let id = b
        .add_template(
            "t",
            TemplateKind::Object,
            "{% for i in range(100000) %}{{ i }}{% endfor %}",
        )
        .unwrap();
    let engine = b.build().unwrap();
    let err = engine.render(&id, &Value::UNDEFINED, "loop").unwrap_err();
    assert!(
        err.message
            .contains("the fuel limit is 1000 per render (--render-fuel)"),
        "{err}"
    );
}

#[test]
fn byte_limit_stops_huge_output() {
    let mut b = EngineBuilder::new(Limits {
        max_bytes: 1_000,
        ..Limits::default()
    });
    let id = b
        .add_template(
            "t",
            TemplateKind::Object,
            "{% for i in range(50) %}{{ spec.v }}{% endfor %}",
        )
        .unwrap();
    let engine = b.build().unwrap();
    let ctx = minijinja::context! { spec => to_value(&json!({"v": "x".repeat(100)})) };
    let err = engine.render(&id, &ctx, "big").unwrap_err();
    assert!(
        err.message.contains("exceeds the limit of 1000 bytes"),
        "{err}"
    );
}

#[test]
fn recursion_limit_stops_deep_nesting() {
    let mut b = EngineBuilder::new(Limits {
        recursion: 5,
        ..Limits::default()
    });
    let id = b
        .add_template(
            "t",
            TemplateKind::Object,
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        )
        .unwrap();
    let engine = b.build().unwrap();
    let err = engine.render(&id, &Value::UNDEFINED, "deep").unwrap_err();
    assert!(
        err.message
            .contains("the recursion limit is 5 (--render-recursion)"),
        "{err}"
    );
}

#[test]
fn text_templates_are_not_escaped() {
    let mut b = EngineBuilder::new(Limits::default());
    let id = b
        .add_template("m", TemplateKind::Text, "{{ n }} replicas \"ok\"")
        .unwrap();
    let engine = b.build().unwrap();
    let out = engine
        .render(&id, &minijinja::context! { n => 3 }, "message")
        .unwrap();
    assert_eq!(out, "3 replicas \"ok\"");
}

#[test]
fn reports_undeclared_names_statically() {
    let mut b = EngineBuilder::new(Limits::default());
    let t = b
        .add_template(
            "t",
            TemplateKind::Object,
            "{% set x = 1 %}{{ parnet.metadata.name ~ x ~ range(2) }}",
        )
        .unwrap();
    let names = b.template_names(&t, false);
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["parnet".to_owned()]
    );
    let e = b
        .add_expression("children.web.status.x | default(0)")
        .unwrap();
    assert!(
        b.expression_names(e, true)
            .contains("children.web.status.x")
    );
}

#[test]
fn syntax_errors_name_the_line() {
    let mut b = EngineBuilder::new(Limits::default());
    let err = b
        .add_template("t", TemplateKind::Object, "a: 1\nb: {{ x + }}\n")
        .unwrap_err();
    assert!(err.to_string().contains("line 2"), "{err}");
    assert!(b.add_expression("a ==").is_err());
}

mod filters {
    use super::*;

    fn run(expr: &str) -> Result<String, RenderError> {
        eval(expr, json!({"spec": {"s": "héllo wörld"}})).map(|v| v.to_string())
    }

    #[test]
    fn base64_round_trips_utf8() {
        assert_eq!(run("'hello' | b64encode").unwrap(), "aGVsbG8=");
        assert_eq!(
            run("spec.s | b64encode | b64decode").unwrap(),
            "héllo wörld"
        );
        assert!(run("'not base64!' | b64decode").is_err());
    }

    #[test]
    fn sha256_is_lowercase_hex_of_utf8() {
        assert_eq!(
            run("'abc' | sha256").unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn tojson_and_toyaml_serialize_values() {
        assert_eq!(run("{'a': [1, 'b']} | tojson").unwrap(), r#"{"a":[1,"b"]}"#);
        let yaml = run("{'a': [1, 'b']} | toyaml").unwrap();
        assert_eq!(
            yaml::parse_value(&yaml, &yaml::Limits::FILES).unwrap(),
            json!({"a": [1, "b"]})
        );
    }

    #[test]
    fn dns_label_makes_valid_labels() {
        assert_eq!(dns_label("My_App.Example"), "my-app-example");
        assert_eq!(dns_label("--x--"), "x");
        let long = dns_label(&"a".repeat(100));
        assert_eq!(long.len(), 63);
        assert_ne!(
            long,
            dns_label(&format!("{}b", "a".repeat(100))),
            "hash keeps them apart"
        );
        let odd = dns_label("___");
        assert!(odd.chars().all(|c| c.is_ascii_hexdigit()) && odd.len() == 8);
        assert_eq!(run("'Hello World' | dns_label").unwrap(), "hello-world");
    }

    #[test]
    fn rand_alnum_gives_requested_length() {
        let a = run("rand_alnum(24)").unwrap();
        assert_eq!(a.len(), 24);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, run("rand_alnum(24)").unwrap());
        assert!(run("rand_alnum(100000)").is_err());
    }

    #[test]
    fn tojson_in_a_child_template_is_a_string_even_when_concatenated() {
        let spec = json!({"s": {"a": "x\"\n: y"}});
        let out = render_yaml(
            "a: {{ spec.s | tojson }}\nb: {{ 'p-' ~ (spec.s | tojson) }}\nc: {{ (spec.s | tojson) ~ '' }}\n",
            spec,
        )
        .unwrap();
        assert_eq!(out["a"], r#"{"a":"x\"\n: y"}"#);
        assert_eq!(out["b"], r#"p-{"a":"x\"\n: y"}"#);
        assert_eq!(out["c"], out["a"]);
    }

    #[test]
    fn filters_refuse_missing_values() {
        for f in [
            "b64encode",
            "b64decode",
            "sha256",
            "dns_label",
            "toyaml",
            "tojson",
        ] {
            let err = run(&format!("spec.missing | {f}")).unwrap_err();
            assert!(err.message.contains("missing value"), "{f}: {err}");
        }
    }
}

#[test]
fn missing_value_in_a_comparison_is_an_error_not_false() {
    let err = eval("spec.typo > 0", json!({"spec": {}})).unwrap_err();
    assert!(err.message.contains("spec.typo > 0"), "{err}");
    assert!(err.message.contains("missing value"), "{err}");
    assert!(eval("spec.typo == 'x'", json!({"spec": {}})).is_err());
    assert!(eval("'x' in spec.typo", json!({"spec": {}})).is_err());
}

#[test]
fn missing_value_in_arithmetic_or_concatenation_is_an_error() {
    assert!(eval("spec.n + 1", json!({"spec": {}})).is_err());
    assert!(eval("spec.a.b * 2", json!({"spec": {}})).is_err());
    let err = eval("'web-' ~ spec.name", json!({"spec": {}})).unwrap_err();
    assert!(err.message.contains("missing value"), "{err}");
    let err = render_yaml("v: {{ 'a' ~ spec.typo }}\n", json!({})).unwrap_err();
    assert!(err.contains("missing value"), "{err}");
}

#[test]
fn missing_value_in_a_filter_other_than_default_is_an_error() {
    assert!(eval("spec.name | upper", json!({"spec": {}})).is_err());
    assert!(eval("spec.name | b64encode", json!({"spec": {}})).is_err());
    assert_eq!(
        eval("spec.a.b.c | default('d') | upper", json!({"spec": {}})).unwrap(),
        Value::from("D")
    );
    assert_eq!(
        eval("spec.a.b is defined and spec.a.b > 0", json!({"spec": {}})).unwrap(),
        Value::from(false)
    );
}

#[test]
fn printed_missing_value_names_the_expression() {
    let err = render_yaml("a: 1\nv: {{ spec.replicas }}\n", json!({})).unwrap_err();
    assert!(err.contains("spec.replicas"), "{err}");
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn boolean_expressions_refuse_other_types() {
    let mut b = EngineBuilder::new(Limits::default());
    let string = b.add_expression("spec.flag").unwrap();
    let engine = b.build().unwrap();
    let ctx = to_value(&json!({"spec": {"flag": "false"}}));
    let err = engine.eval_bool(string, &ctx, "includeWhen").unwrap_err();
    assert!(err.message.contains("must yield a boolean"), "{err}");
    let ctx = to_value(&json!({"spec": {"flag": true}}));
    assert!(engine.eval_bool(string, &ctx, "includeWhen").unwrap());
}

#[test]
fn regex_filters_match_and_replace() {
    let ctx = json!({"spec": {"image": "nginx:1.27"}});
    assert_eq!(
        eval("spec.image | regex_match('^nginx:[0-9.]+$')", ctx.clone()).unwrap(),
        Value::from(true)
    );
    assert_eq!(
        eval("spec.image | regex_replace(':.*$', ':latest')", ctx.clone()).unwrap(),
        Value::from("nginx:latest")
    );
    assert_eq!(
        eval(
            "spec.image | regex_replace('(\\\\w+):(.*)', '$2-$1')",
            ctx.clone()
        )
        .unwrap(),
        Value::from("1.27-nginx")
    );
    let err = eval("spec.image | regex_match('(')", ctx.clone()).unwrap_err();
    assert!(err.message.contains("invalid pattern"), "{err}");
    let long = format!("spec.image | regex_match('{}')", "a".repeat(2000));
    assert!(eval(&long, ctx).is_err());
    assert!(eval("spec.none | regex_match('a')", json!({"spec": {}})).is_err());
}

#[test]
fn conversion_filters_work_in_expressions() {
    let ctx = json!({"spec": {"cpu": "250m", "doc": "{\"a\": 1}", "y": "k: [1, 2]"}});
    assert_eq!(
        eval("spec.cpu | quantity", ctx.clone()).unwrap(),
        Value::from(0.25)
    );
    assert_eq!(
        eval("(spec.doc | fromjson).a", ctx.clone()).unwrap(),
        Value::from(1)
    );
    assert_eq!(
        eval("(spec.y | fromyaml).k | length", ctx).unwrap(),
        Value::from(2)
    );
}

#[test]
fn default_of_a_missing_list_has_length_zero() {
    assert_eq!(
        eval(
            "children.copy | default([]) | length",
            json!({"children": {}})
        )
        .unwrap(),
        Value::from(0)
    );
}
