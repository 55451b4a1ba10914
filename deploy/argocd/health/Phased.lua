-- Argo CD health check for the phased kinds of inference.vllm-operator.dev:
-- InferenceBenchmark, InferenceTuning and ModelCache (one script, installed under each
-- kind's key; obj.kind names the object in the message).
--
-- Each is a run or a download with a status.phase: Pending, Running, Downloading and
-- Deleting are Progressing; Succeeded and Ready are Healthy (an InferenceTuning whose
-- result went Stale says so in the message); Failed is Degraded. The generic rules come
-- first, as in kstatus:
--   observedGeneration behind metadata.generation -> Progressing
--   Reconciling=True -> Progressing, Stalled=True -> Degraded (the first one listed wins)
-- then status.phase, then a Ready condition, and Progressing while there is no status.
-- Lua 5.1, and only what Argo CD gives a script installed through argocd-cm: the base,
-- table and package libraries, no string or math library (so no string.lower, no
-- ("x"):lower()).
local hs = {}
local kind = obj.kind or "object"

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
  hs.message = "Waiting for the operator to start the " .. kind
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

-- The phases, as words for the message (no string library to lower-case them).
local healthy = { Succeeded = "succeeded", Ready = "ready" }
local progressing = {
  Pending = "pending", Running = "running", Downloading = "downloading", Deleting = "being deleted",
}
local phase = status.phase
if phase == "Failed" then
  local detail = find(status.conditions, "Failed") or find(status.conditions, "Ready")
  hs.status = "Degraded"
  hs.message = kind .. " failed"
  if detail ~= nil then
    hs.message = kind .. " failed: " .. say(detail)
  end
  return hs
end
if phase ~= nil and healthy[phase] ~= nil then
  hs.status = "Healthy"
  hs.message = kind .. " " .. healthy[phase]
  local stale = find(status.conditions, "Stale")
  if stale ~= nil and stale.status == "True" then
    hs.message = hs.message .. "; its result is stale: " .. say(stale)
  end
  return hs
end
if phase ~= nil and progressing[phase] ~= nil then
  hs.status = "Progressing"
  hs.message = kind .. " " .. progressing[phase]
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
hs.message = "Waiting for the " .. kind .. "'s phase"
return hs
