// Reading the optional telemetry and health fields of /v1/nodes (utilization, memory_used_mb,
// temperature_c, power_w, healthy/problem per GPU; drained/drain_reason/problem per node). A
// head without telemetry lacks them; every accessor answers null then, and the pages fall back
// to allocation.

function num(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

/** A GPU's utilisation in percent, or null when the head reports none. */
export function gpuUtilisation(gpu) {
  return num(gpu.utilization);
}

export function gpuMemoryUsed(gpu) {
  return num(gpu.memory_used_mb);
}

export function gpuTemperature(gpu) {
  return num(gpu.temperature_c);
}

export function gpuPower(gpu) {
  return num(gpu.power_w);
}

/** Why a GPU is unhealthy, or null when it is fine (or nobody knows). */
export function gpuProblem(gpu) {
  if (gpu.problem) return String(gpu.problem);
  if (gpu.healthy === false) return "unhealthy";
  return null;
}

/** {drained, reason, unhealthy, lastReport} for a node; all empty when the head tells nothing. */
export function nodeHealth(node) {
  const gpuProblems = (node.gpus || []).map(gpuProblem).filter((p) => p !== null);
  const reasons = [node.problem, node.drained ? node.drain_reason : null].filter(Boolean);
  return {
    drained: Boolean(node.drained),
    drainedBy: node.drained_by || "",
    reason: reasons.join("; "),
    unhealthy: Boolean(node.problem) || gpuProblems.length > 0,
    lastReport: num(node.last_report_at),
  };
}
