// Validates the custom resources of deploy/kubernetes (KEDA's ScaledObject
// and TriggerAuthentication, the Prometheus Operator's ServiceMonitor)
// against the schemas of the kubernetes-models packages, which are
// generated from each project's API types and installed (pinned) by
// scripts/deploy-check from the npm registry. Two checks per object:
//
//   * the package's own validator: types, enums, required fields;
//   * unknown fields: the validators accept any extra property, so every
//     key of the object is looked up in the package's type declarations
//     (the `.d.ts` interface of that level), the way the API server's
//     strict field validation refuses a misspelt field.
//
// Input (stdin): a JSON array of {where, doc}. Output: one line per
// problem on stderr; exit code 1 when there is one.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const MODELS = {
  "keda.sh/v1alpha1": "@kubernetes-models/keda/keda.sh/v1alpha1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

// The interface a `.d.ts` file declares first: {props: {name: type},
// imports: {identifier: resolved .d.ts path}}.
const interfaces = new Map();
function declaration(dts) {
  if (interfaces.has(dts)) return interfaces.get(dts);
  const text = readFileSync(dts, "utf8");
  const imports = {};
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g)) {
    // Relative to the declaring file; a package (apimachinery's ObjectMeta,
    // LabelSelector) through its `exports` with the import condition, as
    // node resolves it (the packages are installed beside this script).
    const target = m[2].startsWith(".")
      ? new URL(m[2], "file://" + dts).pathname
      : fileURLToPath(import.meta.resolve(m[2]));
    for (const name of m[1].split(",").map((s) => s.trim())) {
      imports[name] = target.replace(/\.js$/, "") + ".d.ts";
    }
  }
  const start = text.search(/export interface \w+[^{]*\{/);
  // `interface IServiceMonitorSpec extends INativeHistogramConfig`: the
  // parents' fields are this level's too (TypeMeta's are declared here).
  const parents = (text.slice(start).match(/^export interface \w+ extends ([^{]+)\{/) || [null, ""])[1]
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p && p !== "TypeMeta" && imports[p]);
  const alias = text.match(/export type \w+ = (\w+);/);
  if (start < 0 && alias && imports[alias[1]]) {
    // `export type IAuthSecretTargetRef = IAuthTargetRef;`: the other's.
    const result = declaration(imports[alias[1]]);
    interfaces.set(dts, result);
    return result;
  }
  const props = {};
  if (start >= 0) {
    // The body at depth 1: `"name"?: type;` lines; an inline object type
    // (`{ [key: string]: string; }`) is a map and is not looked into.
    let depth = 0;
    let current = null;
    for (const line of text.slice(start).split("\n")) {
      const opens = (line.match(/\{/g) || []).length;
      const closes = (line.match(/\}/g) || []).length;
      if (depth === 1) {
        const m = line.match(/^\s*"([^"]+)"\??: (.*?);?$/);
        if (m) {
          current = m[1];
          props[current] = m[2];
        }
      }
      depth += opens - closes;
      if (depth <= 0 && opens + closes > 0) break;
    }
  }
  for (const p of parents) {
    const inherited = declaration(imports[p]);
    for (const [k, v] of Object.entries(inherited.props)) {
      if (!(k in props)) {
        props[k] = v;
        imports[v.match(/^Array<(\w+)>$/)?.[1] ?? v] ??= inherited.imports[v.match(/^Array<(\w+)>$/)?.[1] ?? v];
      }
    }
  }
  const result = { props, imports };
  interfaces.set(dts, result);
  return result;
}

// The keys of `value` not declared at its level, recursively.
function unknownFields(value, dts, path, out) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return;
  const { props, imports } = declaration(dts);
  for (const [key, child] of Object.entries(value)) {
    const type = props[key];
    if (type === undefined) {
      out.push(`${path}.${key}: unknown field (known here: ${Object.keys(props).sort().join(", ")})`);
      continue;
    }
    const element = type.match(/^Array<(\w+)>$/);
    const name = element ? element[1] : type;
    const target = imports[name];
    if (!target) continue; // a scalar, a map or an inline type
    const items = element && Array.isArray(child) ? child : [child];
    items.forEach((item, i) =>
      unknownFields(item, target, element ? `${path}.${key}[${i}]` : `${path}.${key}`, out),
    );
  }
}

const input = JSON.parse(readFileSync(0, "utf8"));
const problems = [];
for (const { where, doc } of input) {
  const module = MODELS[doc.apiVersion];
  if (!module) {
    problems.push(`${where}: no schema for apiVersion ${doc.apiVersion}`);
    continue;
  }
  const models = await import(module);
  const Model = models[doc.kind];
  if (!Model) {
    problems.push(`${where}: ${doc.apiVersion} has no kind ${doc.kind}`);
    continue;
  }
  try {
    new Model(doc).validate();
  } catch (e) {
    problems.push(`${where}: ${e.message}`);
  }
  const modelFile = fileURLToPath(import.meta.resolve(`${module}/${doc.kind}`));
  const found = [];
  unknownFields(doc, modelFile.replace(/\.js$/, ".d.ts"), doc.kind, found);
  for (const f of found) problems.push(`${where}: ${f}`);
}
for (const p of problems) console.error(p);
process.exit(problems.length ? 1 : 0);
