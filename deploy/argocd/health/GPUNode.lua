-- Argo CD health check for inference.vllm-operator.dev/GPUNode.
--
-- The node agent publishes facts about the node's GPUs as conditions:
--   observedGeneration behind metadata.generation -> Progressing (a new spec.power
--     policy not yet applied)
--   Reconciling=True -> Progressing, Stalled=True -> Degraded (generic rules, as kstatus)
--   Ready=False -> Degraded (NVML could not be read, or no GPUs)
--   PowerCapped=True set by something else than the GPUNode's own power policy
--     (reason LimitBelowDefault) -> Degraded: the silent power cap the product exists
--     to expose
--   LinkDegraded=True -> Degraded (a PCIe link narrower or slower than the slot allows)
--   Ready=True -> Healthy (ClocksThrottled=True is named in the message only: heat and
--     power brakes come and go)
--   no status yet -> Progressing (waiting for the agent)
-- kstatus reads only the generic rules and Ready, so it calls the Degraded cases other
-- than Stalled InProgress (Ready=False) or Current (faults); see deploy/argocd/README.md.
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
  hs.message = "Waiting for the node agent to report the GPUs"
  return hs
end

local generation = obj.metadata.generation
local observed = status.observedGeneration
if generation ~= nil and observed ~= nil and observed ~= generation then
  hs.status = "Progressing"
  hs.message = "The node agent has not observed generation " .. generation
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
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the node agent to report the GPUs"
  return hs
end
if ready.status ~= "True" then
  hs.status = "Degraded"
  hs.message = say(ready)
  return hs
end

local capped = find(status.conditions, "PowerCapped")
if capped ~= nil and capped.status == "True" and capped.reason ~= "CappedByPowerPolicy" then
  hs.status = "Degraded"
  hs.message = say(capped)
  return hs
end
local link = find(status.conditions, "LinkDegraded")
if link ~= nil and link.status == "True" then
  hs.status = "Degraded"
  hs.message = say(link)
  return hs
end

hs.status = "Healthy"
hs.message = say(ready)
local throttled = find(status.conditions, "ClocksThrottled")
if throttled ~= nil and throttled.status == "True" then
  hs.message = hs.message .. "; " .. say(throttled)
end
return hs
