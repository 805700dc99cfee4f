/* entry.c — the dlock tool's main: the tool is cli_main (main.c). */
#include "cli.h"

int main(int argc, char **argv)
{
	return cli_main(argc, argv);
}
