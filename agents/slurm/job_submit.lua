--[[
Pharos job_submit.lua (Slurm's job_submit/lua plugin; slurm.conf: JobSubmitPlugins=lua, this
file next to slurm.conf). It tags each submitted job with Pharos's predicted I/O class from
history, in the job's admin_comment ("pharos:class=dedicated,pattern=N-1,runs=3"), which
operators see in `scontrol show job` (AdminComment=) and `squeue -O AdminComment`. When the
control loop suggests node-local mode for the job (an N-N job, metadata-heavy or
metadata-dominated: Sunway storage paper §6), the tag ends in ",node_local=suggested"
("pharos:class=dedicated,pattern=N-N,runs=3,node_local=suggested"); the job asks for it itself
(srun --pharos-node-local=MOUNT): the tag changes nothing of the job.

slurmctld runs job_submit with its locks held, so this never calls the network: it reads the
table that `pharos slurm classes --out FILE` writes (user, job name, DFRA class, usual pattern,
runs, node_local yes/no; from GET /v1/hints/classes; rows of 5 columns, without node_local, as
older versions wrote them, are read too), parsed again whenever its content changes. FILE is
$PHAROS_SLURM_CLASSES in slurmctld's environment, else /var/lib/pharos/slurm/classes.tsv.
A job with no history, or no table, is submitted untouched; an admin_comment someone else set
is kept (the tag is appended).
]]

local CLASSES = os.getenv("PHAROS_SLURM_CLASSES") or "/var/lib/pharos/slurm/classes.tsv"
local cache = { text = nil, rows = {} }

-- The file's whole content (nil when it cannot be read): the table is parsed again whenever any
-- byte of it changes, even within the same second and at the same size (Lua has no stat; the
-- file is small and read once per submission).
local function read_all(path)
	local f = io.open(path, "rb")
	if not f then
		return nil
	end
	local text = f:read("*a")
	f:close()
	return text
end

local function load_classes()
	local text = read_all(CLASSES)
	if text == nil then
		cache = { text = nil, rows = {} }
		return cache.rows
	end
	if text == cache.text then
		return cache.rows
	end
	local rows, n = {}, 0
	for line in text:gmatch("[^\n]+") do
		line = line:gsub("\r$", "")
		if line:sub(1, 1) ~= "#" then
			-- user, name, class, pattern, runs[, node_local]
			local user, name, class, pattern, runs, node_local =
				line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$")
			if not user then
				user, name, class, pattern, runs = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$")
			end
			if user then
				local tag = string.format("pharos:class=%s,pattern=%s,runs=%s", class, pattern, runs)
				if node_local == "yes" then
					tag = tag .. ",node_local=suggested"
				end
				rows[user .. "\t" .. name] = tag
				n = n + 1
			end
		end
	end
	cache = { text = text, rows = rows }
	slurm.log_info("pharos: %d I/O classes read from %s", n, CLASSES)
	return rows
end

local function user_name(uid)
	local p = io.popen("getent passwd " .. tostring(math.floor(uid)))
	if not p then
		return ""
	end
	local line = p:read("*l") or ""
	p:close()
	return line:match("^([^:]*)") or ""
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local name = job_desc.name or ""
	if name == "" then
		return slurm.SUCCESS
	end
	local ok, rows = pcall(load_classes)
	if not ok then
		slurm.log_error("pharos: cannot read %s: %s", CLASSES, tostring(rows))
		return slurm.SUCCESS
	end
	local user = job_desc.user_name or user_name(job_desc.user_id or submit_uid)
	local tag = rows[user .. "\t" .. name]
	if tag then
		local old = job_desc.admin_comment
		if old ~= nil and old ~= "" then
			job_desc.admin_comment = old .. " " .. tag
		else
			job_desc.admin_comment = tag
		end
		slurm.log_info("pharos: job %s of %s tagged %s", name, user, tag)
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

slurm.log_info("pharos: job_submit.lua loaded (classes from %s)", CLASSES)
return slurm.SUCCESS
