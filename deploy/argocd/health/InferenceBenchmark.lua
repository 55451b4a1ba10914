-- Argo CD health check for inference.vllm-operator.dev/InferenceBenchmark.
--
-- A benchmark is a run: Pending and Running are Progressing, Succeeded is Healthy, Failed
-- is Degraded. The generic rules come first, as in kstatus:
--   observedGeneration behind metadata.generation -> Progressing
--   Reconciling=True -> Progressing, Stalled=True -> Degraded (the first one listed wins)
-- then status.phase, then a Ready condition, and Progressing while there is no status.
-- Lua 5.1 only: Argo CD runs these scripts with gopher-lua.
local hs = {}

local function find(conditions, wanted)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function say(c)
  local reason = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then
    return reason .. ": " .. c.message
  end
  return reason
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to start the benchmark"
  return hs
end

local generation = obj.metadata.generation
local observed = status.observedGeneration
if generation ~= nil and observed ~= nil and observed ~= generation then
  hs.status = "Progressing"
  hs.message = "The operator has not observed generation " .. generation
    .. " yet (observed " .. observed .. ")"
  return hs
end

if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Reconciling" and c.status == "True" then
      hs.status = "Progressing"
      hs.message = say(c)
      return hs
    end
    if c.type == "Stalled" and c.status == "True" then
      hs.status = "Degraded"
      hs.message = say(c)
      return hs
    end
  end
end

local phase = status.phase
local detail = find(status.conditions, "Failed") or find(status.conditions, "Ready")
if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = "Benchmark failed"
  if detail ~= nil then
    hs.message = "Benchmark failed: " .. say(detail)
  end
  return hs
end
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Benchmark succeeded"
  return hs
end
if phase == "Pending" or phase == "Running" then
  hs.status = "Progressing"
  hs.message = "Benchmark " .. string.lower(phase)
  return hs
end

local ready = find(status.conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = say(ready)
  return hs
end
if ready ~= nil then
  hs.status = "Progressing"
  hs.message = say(ready)
  return hs
end

hs.status = "Progressing"
hs.message = "Waiting for the benchmark's phase"
return hs
