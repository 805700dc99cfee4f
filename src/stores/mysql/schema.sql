-- The tables of the MySQL/MariaDB store (mysql://…, both modes). Embedded in
-- the library at build time and run by the first client of a database that
-- finds no dlock_meta; the client then records the schema version there.
-- A user without CREATE can run on tables an administrator made from this file.

CREATE TABLE IF NOT EXISTS dlock_meta (
 k VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
 v VARCHAR(255) CHARACTER SET ascii NOT NULL
) ENGINE=InnoDB;

-- One row per name ever locked: the fence counter. Never deleted.
CREATE TABLE IF NOT EXISTS dlock_lock (
 ns VARBINARY(255) NOT NULL,
 name VARBINARY(512) NOT NULL,
 fence BIGINT UNSIGNED NOT NULL DEFAULT 0,
 PRIMARY KEY (ns, name)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS dlock_holder (
 ns VARBINARY(255) NOT NULL,
 name VARBINARY(512) NOT NULL,
 owner VARBINARY(128) NOT NULL,
 mode TINYINT NOT NULL,
 permits INT UNSIGNED NOT NULL,
 fence BIGINT UNSIGNED NOT NULL,
 expires DATETIME(6) NOT NULL,
 host VARBINARY(255) NOT NULL DEFAULT '',
 pid INT NOT NULL DEFAULT 0,
 -- mode=get_lock: the session holding the GET_LOCK (the row is only a
 -- record for status; the lock itself is the server's). 0 in mode=table.
 conn_id BIGINT UNSIGNED NOT NULL DEFAULT 0,
 PRIMARY KEY (ns, name, owner)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS dlock_waiter (
 seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
 ns VARBINARY(255) NOT NULL,
 name VARBINARY(512) NOT NULL,
 owner VARBINARY(128) NOT NULL,
 mode TINYINT NOT NULL,
 expires DATETIME(6) NOT NULL,
 UNIQUE KEY name_owner (ns, name, owner)
) ENGINE=InnoDB;
