BEGIN TRANSACTION;
CREATE TABLE job_events (
	id INTEGER NOT NULL, 
	job_id INTEGER NOT NULL, 
	at FLOAT NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	reason TEXT NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id)
);
INSERT INTO "job_events" VALUES(1,1,1700000000.0,'queued','submitted');
INSERT INTO "job_events" VALUES(2,2,1700000001.0,'queued','submitted');
INSERT INTO "job_events" VALUES(3,3,1700000002.0,'queued','submitted');
INSERT INTO "job_events" VALUES(4,4,1700000003.0,'queued','submitted');
INSERT INTO "job_events" VALUES(5,5,1700000004.0,'queued','submitted');
INSERT INTO "job_events" VALUES(6,2,1700000010.0,'running','started');
INSERT INTO "job_events" VALUES(7,3,1700000010.0,'running','started');
INSERT INTO "job_events" VALUES(8,4,1700000010.0,'running','started');
INSERT INTO "job_events" VALUES(9,3,1700000015.0,'succeeded','exited 0');
INSERT INTO "job_events" VALUES(10,4,1700000020.0,'failed','exited 3');
INSERT INTO "job_events" VALUES(11,5,1700000005.0,'cancelled','cancelled by user');
CREATE TABLE jobs (
	id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, 
	name VARCHAR(128) NOT NULL, 
	team VARCHAR(128) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	priority INTEGER NOT NULL, 
	gpus FLOAT NOT NULL, 
	gpu_type VARCHAR(64), 
	spec TEXT NOT NULL, 
	submitted_at FLOAT NOT NULL, 
	started_at FLOAT, 
	ended_at FLOAT, 
	exit_code INTEGER, 
	reason TEXT NOT NULL, 
	attempt INTEGER NOT NULL, 
	allocation TEXT, 
	launch TEXT, 
	stop_reason VARCHAR(32), 
	stop_requested_at FLOAT, 
	term_sent BOOLEAN NOT NULL, 
	kill_sent BOOLEAN NOT NULL, 
	request TEXT, 
	wait_reason VARCHAR(32), 
	estimated_start FLOAT, 
	stop_message TEXT, 
	last_checkpoint_at FLOAT
);
INSERT INTO "jobs" VALUES(1,'train','vision','queued',2,2.0,'H100-80GB','{"command":["python","train.py","--epochs","10"],"gpus":2.0,"gpu_type":"H100-80GB","gpu_memory":null,"min_gpu_memory":null,"nodes":null,"name":"train","team":"vision","priority":"high","time_limit":7200.0,"env":{"WANDB_MODE":"offline"},"workdir":null,"shell":false}',1700000000.0,NULL,NULL,NULL,'submitted',0,NULL,NULL,NULL,NULL,0,0,'{"t":["H100-80GB"],"tl":7200.0}',NULL,NULL,NULL,NULL);
INSERT INTO "jobs" VALUES(2,'held','nlp','running',1,1.0,NULL,'{"command":["sleep","600"],"gpus":1.0,"gpu_type":null,"gpu_memory":null,"min_gpu_memory":null,"nodes":null,"name":"held","team":"nlp","priority":"normal","time_limit":null,"env":{},"workdir":null,"shell":false}',1700000001.0,1700000010.0,NULL,NULL,'started',1,'[{"node": "node0", "gpu_indices": [0]}]','{"pid": 4194311, "pgid": 4194311, "start_ticks": 1, "run_dir": "/nonexistent/run"}',NULL,NULL,0,0,'{}',NULL,NULL,NULL,NULL);
INSERT INTO "jobs" VALUES(3,'','nlp','succeeded',1,1.0,NULL,'{"command":["true"],"gpus":1.0,"gpu_type":null,"gpu_memory":null,"min_gpu_memory":null,"nodes":null,"name":null,"team":"nlp","priority":"normal","time_limit":null,"env":{},"workdir":null,"shell":false}',1700000002.0,1700000010.0,1700000015.0,0,'exited 0',1,'[{"node": "node0", "gpu_indices": [1]}]','{"pid": 4194311, "pgid": 4194311, "start_ticks": 1, "run_dir": "/nonexistent/run"}',NULL,NULL,0,0,'{}',NULL,NULL,NULL,NULL);
INSERT INTO "jobs" VALUES(4,'broken','default','failed',1,1.0,NULL,'{"command":["false"],"gpus":1.0,"gpu_type":null,"gpu_memory":null,"min_gpu_memory":null,"nodes":null,"name":"broken","team":"default","priority":"normal","time_limit":null,"env":{},"workdir":null,"shell":false}',1700000003.0,1700000010.0,1700000020.0,3,'exited 3',1,'[{"node": "node0", "gpu_indices": [2]}]','{"pid": 4194311, "pgid": 4194311, "start_ticks": 1, "run_dir": "/nonexistent/run"}',NULL,NULL,0,0,'{}',NULL,NULL,NULL,NULL);
INSERT INTO "jobs" VALUES(5,'cancelled-in-queue','default','cancelled',1,1.0,NULL,'{"command":["sleep","1"],"gpus":1.0,"gpu_type":null,"gpu_memory":null,"min_gpu_memory":null,"nodes":null,"name":"cancelled-in-queue","team":"default","priority":"normal","time_limit":null,"env":{},"workdir":null,"shell":false}',1700000004.0,NULL,1700000005.0,NULL,'cancelled by user',0,NULL,NULL,NULL,NULL,0,0,'{}',NULL,NULL,NULL,NULL);
CREATE TABLE meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "meta" VALUES('schema','2');
CREATE TABLE nodes (
	name VARCHAR(255) NOT NULL, 
	"virtual" BOOLEAN NOT NULL, 
	gpus TEXT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (name)
);
INSERT INTO "nodes" VALUES('node0',1,'[{"index": 0, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-0", "domain": null}, {"index": 1, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-1", "domain": null}, {"index": 2, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-2", "domain": null}, {"index": 3, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-3", "domain": null}, {"index": 4, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-4", "domain": null}, {"index": 5, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-5", "domain": null}, {"index": 6, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-6", "domain": null}, {"index": 7, "model": "H100-80GB", "memory_mb": 81920, "uuid": "GPU-7", "domain": null}]',1700000000.0);
CREATE TABLE team_usage (
	team VARCHAR(128) NOT NULL, 
	gpu_seconds FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (team)
);
INSERT INTO "team_usage" VALUES('vision',7200.0,1700000030.0);
INSERT INTO "team_usage" VALUES('nlp',30.0,1700000030.0);
CREATE INDEX ix_jobs_state ON jobs (state);
CREATE INDEX ix_jobs_team_state ON jobs (team, state);
CREATE INDEX ix_job_events_job ON job_events (job_id);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('jobs',5);
COMMIT;
