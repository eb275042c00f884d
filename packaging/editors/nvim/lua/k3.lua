-- k3.nvim: send the buffer or a selection to the local k3d and stream the reply into a split.
--
-- It talks to k3d's OpenAI-compatible HTTP API over its Unix socket (`k3d serve --http
-- unix:PATH`) with curl, so nothing but Neovim >= 0.7 and curl is needed, and no key: the
-- daemon knows the caller by uid. Commands (plugin/k3.lua):
--   :K3          send the whole buffer           :'<,'>K3   send the selected lines
--   :K3Cancel    stop the reply in progress (also <C-c> in the reply window); the daemon
--                stops computing within one layer when the connection closes.
local M = {}

M.config = {
  -- k3d serve --http unix:PATH; default $K3_HTTP_SOCKET, else $XDG_RUNTIME_DIR/k3d-http.sock.
  socket = os.getenv("K3_HTTP_SOCKET")
    or ((os.getenv("XDG_RUNTIME_DIR") or "/run/k3d") .. "/k3d-http.sock"),
  -- nil: the first model GET /v1/models lists.
  model = nil,
  system = nil,
  max_tokens = 512,
  temperature = 0,
  -- K3 thinks before answering unless told not to; an editor usually wants the answer.
  thinking = false,
  curl = "curl",
}

-- The reply in progress (or the last one): its job, buffer and how it ended.
M.state = { job = nil, buf = nil, done = false, cancelled = false, error = nil }

function M.setup(opts)
  M.config = vim.tbl_extend("force", M.config, opts or {})
end

local function url(path)
  return "http://k3d" .. path
end

local function model()
  if M.config.model then
    return M.config.model
  end
  local out = vim.fn.system({ M.config.curl, "-sS", "--unix-socket", M.config.socket, url("/v1/models") })
  if vim.v.shell_error ~= 0 then
    error("k3: cannot reach k3d at " .. M.config.socket .. ": " .. out)
  end
  local ok, list = pcall(vim.fn.json_decode, out)
  if not ok or type(list) ~= "table" or type(list.data) ~= "table" or not list.data[1] then
    error("k3: unexpected /v1/models reply: " .. out)
  end
  return list.data[1].id
end

-- Appends `text` (which may hold newlines) at the end of `buf`.
local function append(buf, text)
  if text == "" or not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  local last = vim.api.nvim_buf_line_count(buf)
  local tail = vim.api.nvim_buf_get_lines(buf, last - 1, last, false)[1] or ""
  local lines = vim.split(tail .. text, "\n", { plain = true })
  vim.api.nvim_buf_set_lines(buf, last - 1, last, false, lines)
end

local function reply_window()
  vim.cmd("botright new")
  local buf = vim.api.nvim_get_current_buf()
  vim.bo[buf].buftype = "nofile"
  vim.bo[buf].bufhidden = "wipe"
  vim.bo[buf].swapfile = false
  vim.bo[buf].filetype = "markdown"
  vim.keymap.set("n", "<C-c>", M.cancel, { buffer = buf, desc = "k3: cancel the reply" })
  return buf
end

-- One line of reply `state`'s event stream (`data: {...}` or `data: [DONE]`).
local function event(state, line)
  local data = line:match("^data: (.*)$")
  if not data then
    return
  end
  if data == "[DONE]" then
    state.done = true
    return
  end
  local ok, chunk = pcall(vim.fn.json_decode, data)
  if not ok or type(chunk) ~= "table" then
    return
  end
  if chunk.error then
    state.error = chunk.error.message
    append(state.buf, "\n[k3: " .. tostring(chunk.error.message) .. "]")
    return
  end
  local choice = chunk.choices and chunk.choices[1]
  local delta = choice and choice.delta
  if type(delta) == "table" and type(delta.content) == "string" then
    append(state.buf, delta.content)
  end
end

--- Sends `text` as the user's message and streams the reply into a new split.
function M.send(text)
  if M.state.job then
    M.cancel()
  end
  local messages = {}
  if M.config.system then
    table.insert(messages, { role = "system", content = M.config.system })
  end
  table.insert(messages, { role = "user", content = text })
  local body = vim.fn.json_encode({
    model = model(),
    messages = messages,
    stream = true,
    max_tokens = M.config.max_tokens,
    temperature = M.config.temperature,
    thinking = { type = M.config.thinking and "enabled" or "disabled" },
  })
  local buf = reply_window()
  -- This reply's own state: the callbacks below update it even after a newer reply replaced
  -- it as M.state.
  local state = { job = nil, buf = buf, done = false, cancelled = false, error = nil }
  M.state = state
  local partial = ""
  local job = vim.fn.jobstart({
    M.config.curl, "-sS", "-N", "--fail-with-body", "--unix-socket", M.config.socket,
    "-H", "Content-Type: application/json", "--data-binary", "@-", url("/v1/chat/completions"),
  }, {
    -- Lines arrive in pieces: the first item continues the previous call's last one.
    on_stdout = function(_, data)
      data[1] = partial .. data[1]
      partial = table.remove(data)
      for _, line in ipairs(data) do
        event(state, line)
      end
    end,
    on_exit = function(_, code)
      if partial ~= "" then
        event(state, partial)
      end
      if code ~= 0 and not state.cancelled and not state.error then
        state.error = "curl exited " .. code
        append(buf, "\n[k3: the request failed (curl exit " .. code .. ")]")
      end
      state.job = nil
      state.done = true
    end,
  })
  if job <= 0 then
    error("k3: cannot start " .. M.config.curl)
  end
  state.job = job
  vim.fn.chansend(job, body)
  vim.fn.chanclose(job, "stdin")
  return buf
end

--- Lines `first`..`last` of the current buffer (the whole buffer by default).
function M.send_lines(first, last)
  local lines = vim.api.nvim_buf_get_lines(0, first - 1, last, false)
  return M.send(table.concat(lines, "\n"))
end

--- Stops the reply in progress: closing the connection makes k3d stop computing.
function M.cancel()
  if M.state.job then
    M.state.cancelled = true
    vim.fn.jobstop(M.state.job)
  end
end

return M
