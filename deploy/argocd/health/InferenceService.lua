-- Argo CD health check for inference.vllm-operator.dev/InferenceService.
--
-- Reads the status the operator computes (observedGeneration plus the conditions Ready,
-- Reconciling, Stalled) with the rules kstatus uses, so Argo CD and Flux agree:
--   observedGeneration behind metadata.generation -> Progressing
--   Reconciling=True -> Progressing, Stalled=True -> Degraded (the first one listed wins)
--   Ready=True -> Healthy, Ready=False/Unknown -> Progressing
--   no status or no conditions yet -> Progressing (kstatus would say Current here)
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
  hs.message = "Waiting for the operator to report status"
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
hs.message = "Waiting for the Ready condition"
return hs
